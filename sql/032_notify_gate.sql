-- pgjobq schema migration 32: the notification gate (docs/design.md, "The notification gate").
-- needs: 31
--
-- A commit that carries a NOTIFY takes PostgreSQL's notification lock before its commit record and
-- holds it through the WAL flush, so producers that notify commit one at a time, and each such commit
-- wakes every session that listens in the database (with 40 worker processes listening, producers of
-- one job a transaction reached a quarter of their rate: bench/README.md, "The notification gate").
-- While a worker is known to claim again within a few milliseconds, a notification tells nobody
-- anything, so producers skip it:
--
--   pgjobq.notify_gate_0 .. _63   one sequence per slot of queues (hashtext(queue) & 63), set in place
--                      (a sequence, not a row: no dead version per stamp, even while a snapshot is
--                      held open).  Its value is a stamp: (microseconds since 1970 >> 4) << 16, or'd
--                      with 16 more bits of the queue's hash (its tag).  A claim of a worker that
--                      asks for it (claim_next's gate => true) and that took some jobs, but fewer than
--                      it asked for and could take, sets the slot of its queue: that worker has
--                      promised to claim from the queue again once the window
--                      (pgjobq.notify_gate_window(), 5 ms) has passed, and then until every
--                      transaction that was running then has ended (src/worker.c, "the gate").
--   pgjobq.notify      sends a queue's notification only when the queue's slot holds no stamp of
--                      its own tag younger than the window: producers read the gate, never write it.
--
-- claim_next takes gate last: dropped here and made again by the function file.  Libraries of
-- version 31 keep working: their workers do not ask for the gate, so they never stamp one, and their
-- producers call pgjobq.notify, which is gated only by stamps of workers that will claim again.

DO $$
BEGIN
    FOR v_n IN 0..63 LOOP
        EXECUTE format('CREATE SEQUENCE pgjobq.%I', 'notify_gate_' || v_n);
    END LOOP;
END
$$;

DROP FUNCTION IF EXISTS pgjobq.claim_next(text, integer, interval, text, smallint[], timestamptz[], bigint[],
                                          timestamptz[], bigint[], boolean);
