-- Enqueue 100 jobs in one INSERT into the minimal table.
INSERT INTO ceiling.jobs (queue, payload)
SELECT 'q', '{"to": "someone@example.org", "n": 12345}'::jsonb FROM generate_series(1, 100);
