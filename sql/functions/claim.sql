-- pgjobq functions: the claim (queued -> running) and what a worker asks before it claims.
--
-- Applied by `pgjobq migrate` with the other files of sql/functions (docs/hacking.md): each function
-- is defined once, here, as it is now.

-- claim_batch: the claim the worker runs.  Takes up to max_jobs due jobs of one queue, in (priority,
-- run_at, id) order, skipping rows others hold (SKIP LOCKED); each becomes running with attempt + 1,
-- a new lease token and a lease until now() + lease.  Returns only what a worker needs, and a job that
-- had parents comes with their results (`parents`: a column that is NULL for every other job, so the
-- claim of a plain job costs one test of a NULL column; it is the last, so a library of version 7,
-- which names the columns it reads, is not affected).
--
-- after_priority, after_run_at, after_id (all three, or none): start after this key.  A claimer that
-- passes the largest key its previous claim returned skips the index entries of every job claimed
-- since the last vacuum (they are dead but stay in the index until vacuum removes them, and a claim
-- from the head walks all of them: ~2 us per index page, growing with every job).  A job that sorts
-- before the key (a higher priority enqueued meanwhile, an explicit run_at in the past, a claim that
-- rolled back) is not seen by such a claim: the caller must also claim without a key regularly (the
-- worker does at least every 100 ms, and whenever a claim with a key comes back short).
--
-- The lease token is the job's previous token plus one, and at least the claim's time on the database
-- clock in microseconds.  Plus one alone could repeat itself after a failover to an asynchronous
-- standby that lost the last claim of a job: a worker still holding the lease the old primary gave
-- would pass the fencing check of a lease it never had.  With the clock in it, every token the new
-- primary gives is greater than any the old one gave, as long as the two servers' clocks agree to
-- within the failover time.
--
-- The queue's settings (pgjobq.queues): a paused queue's claim returns nothing.  A claim from a queue
-- with a limit first locks the queue's row (FOR UPDATE), so that limited claims of one queue run one
-- at a time, and then counts, in a new snapshot, what the limit is about: the running jobs whose lease
-- has not expired, or the starts still inside the rate window.  Counting in the claim's own snapshot
-- instead lets two claims that start together both see a free slot (the race PgQueuer #761
-- describes); a separate counter drifts when a worker dies (Solid Queue #546).  The count is derived
-- from the job rows themselves, so an expired lease frees its slot at once, without waiting for the
-- rescuer.  Claims from queues without limits take no lock and read the settings row only (one
-- primary-key probe).  The rate window is exact: the queue's row keeps the start times of the jobs
-- started inside the last rate_period (at most rate_limit of them), so "100 per minute" never lets
-- 200 start within a minute across a boundary, as a token bucket of capacity 100 would.
CREATE OR REPLACE FUNCTION pgjobq.claim_batch(
    queue          text,
    max_jobs       integer,
    lease          interval,
    worker_id      text,
    after_priority smallint    DEFAULT NULL,
    after_run_at   timestamptz DEFAULT NULL,
    after_id       bigint      DEFAULT NULL)
RETURNS TABLE (id bigint, kind text, payload jsonb, priority smallint, attempt integer, max_attempts integer,
               lease_token bigint, run_at timestamptz, created_at timestamptz, started_at timestamptz,
               lease_until timestamptz, unique_key text, last_error text, parents jsonb)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s         pgjobq.queues%ROWTYPE;
    v_limited boolean := false;
    v_room    integer;
    v_window  timestamptz[];
    v_claimed integer;
BEGIN
    IF max_jobs IS NULL OR max_jobs < 1 OR max_jobs > 10000 THEN
        RAISE EXCEPTION 'pgjobq.claim: max_jobs must be between 1 and 10000, not %', max_jobs
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF lease IS NULL OR lease <= interval '0' THEN
        RAISE EXCEPTION 'pgjobq.claim: lease must be positive, not %', lease
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (after_priority IS NULL) <> (after_run_at IS NULL) OR (after_priority IS NULL) <> (after_id IS NULL) THEN
        RAISE EXCEPTION 'pgjobq.claim: give all of after_priority, after_run_at and after_id, or none'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    SELECT * INTO s FROM pgjobq.queues qs WHERE qs.name = claim_batch.queue;
    IF FOUND THEN
        IF s.paused_at IS NOT NULL THEN
            RETURN;
        END IF;
        IF s.concurrency IS NOT NULL OR s.rate_limit IS NOT NULL OR s.key_concurrency IS NOT NULL THEN
            IF current_setting('transaction_isolation') <> 'read committed' THEN
                RAISE EXCEPTION 'pgjobq.claim: queue % has a limit; claim from it in a READ COMMITTED transaction', queue
                    USING ERRCODE = 'invalid_transaction_state',
                          HINT = 'A snapshot older than the claim cannot see the jobs other claims just started.';
            END IF;
            -- Limited claims of this queue run one at a time from here to their commit.  The counts
            -- below are new statements, so each sees every claim committed before this lock was given.
            SELECT * INTO s FROM pgjobq.queues qs WHERE qs.name = claim_batch.queue FOR UPDATE;
            IF s.paused_at IS NOT NULL THEN
                RETURN;
            END IF;
            v_room := max_jobs;
            IF s.concurrency IS NOT NULL THEN
                v_room := least(v_room, s.concurrency - (
                    SELECT count(*)::integer FROM pgjobq.jobs j
                     WHERE j.state = 'running' AND j.queue = claim_batch.queue AND j.lease_until > now()));
            END IF;
            IF s.rate_limit IS NOT NULL THEN
                v_window := ARRAY(SELECT t FROM unnest(s.recent_starts) t WHERE t > now() - s.rate_period ORDER BY t);
                v_room := least(v_room, s.rate_limit - cardinality(v_window));
            END IF;
            IF v_room <= 0 THEN
                RETURN;
            END IF;
            v_limited := true;
            max_jobs := v_room;
            after_id := NULL; -- a limited claim takes the head: few jobs, and none may be passed over
        END IF;
    END IF;

    IF v_limited AND s.key_concurrency IS NOT NULL THEN
        -- Per key: each key's due jobs, at most its free slots, then round-robin over the keys (every
        -- key's first job before any key's second); jobs without a key compete as their own.
        RETURN QUERY
        WITH RECURSIVE keys(k) AS (
            (SELECT j.concurrency_key::text FROM pgjobq.jobs j
              WHERE j.state = 'queued' AND j.queue = claim_batch.queue AND j.concurrency_key IS NOT NULL
              ORDER BY j.concurrency_key LIMIT 1)
            UNION ALL
            SELECT (SELECT j.concurrency_key::text FROM pgjobq.jobs j
                     WHERE j.state = 'queued' AND j.queue = claim_batch.queue AND j.concurrency_key IS NOT NULL
                       AND j.concurrency_key > keys.k
                     ORDER BY j.concurrency_key LIMIT 1)
              FROM keys WHERE keys.k IS NOT NULL),
        busy AS (
            SELECT j.concurrency_key::text AS k, count(*) AS n FROM pgjobq.jobs j
             WHERE j.state = 'running' AND j.queue = claim_batch.queue AND j.lease_until > now()
               AND j.concurrency_key IS NOT NULL
             GROUP BY 1),
        cand AS (
            SELECT c.id, c.priority, c.run_at, c.rn
              FROM keys
              CROSS JOIN LATERAL (
                  SELECT j.id, j.priority, j.run_at,
                         row_number() OVER (ORDER BY j.priority, j.run_at, j.id) AS rn
                    FROM pgjobq.jobs j
                   WHERE j.state = 'queued' AND j.queue = claim_batch.queue AND j.concurrency_key = keys.k
                     AND j.run_at <= now()
                   ORDER BY j.priority, j.run_at, j.id
                   LIMIT greatest(s.key_concurrency - coalesce((SELECT b.n FROM busy b WHERE b.k = keys.k), 0), 0)) c
             WHERE keys.k IS NOT NULL
            UNION ALL
            SELECT u.id, u.priority, u.run_at, row_number() OVER (ORDER BY u.priority, u.run_at, u.id)
              FROM (SELECT j.id, j.priority, j.run_at FROM pgjobq.jobs j
                     WHERE j.state = 'queued' AND j.queue = claim_batch.queue AND j.concurrency_key IS NULL
                       AND j.run_at <= now()
                     ORDER BY j.priority, j.run_at, j.id
                     LIMIT claim_batch.max_jobs) u),
        picked AS MATERIALIZED (
            SELECT j.id FROM pgjobq.jobs j
             WHERE j.id = ANY (ARRAY(SELECT cand.id FROM cand
                                      ORDER BY cand.rn, cand.priority, cand.run_at, cand.id
                                      LIMIT claim_batch.max_jobs))
               AND j.state = 'queued'
               FOR UPDATE SKIP LOCKED)
        UPDATE pgjobq.jobs j
           SET state = 'running', attempt = j.attempt + 1,
               lease_token = greatest(j.lease_token + 1, (extract(epoch FROM now()) * 1000000)::bigint),
               lease_until = now() + claim_batch.lease, started_at = now(), worker_id = claim_batch.worker_id
         WHERE j.id = ANY (ARRAY(SELECT picked.id FROM picked))
        RETURNING j.id, j.kind::text, j.payload::jsonb, j.priority, j.attempt, j.max_attempts, j.lease_token,
                  j.run_at, j.created_at, j.started_at, j.lease_until, j.unique_key::text, j.last_error,
                  CASE WHEN j.on_parent_failure IS NOT NULL THEN pgjobq.parents_json(j.id) END;
    -- Two statements rather than one with "after_id IS NULL OR ...": each keeps a plan whose index
    -- scan starts where it should.
    ELSIF after_id IS NULL THEN
        RETURN QUERY
        WITH picked AS MATERIALIZED (
            SELECT j.id FROM pgjobq.jobs j
             WHERE j.state = 'queued' AND j.queue = claim_batch.queue AND j.run_at <= now()
             ORDER BY j.priority, j.run_at, j.id
             LIMIT claim_batch.max_jobs
               FOR UPDATE SKIP LOCKED)
        UPDATE pgjobq.jobs j
           SET state = 'running', attempt = j.attempt + 1,
               lease_token = greatest(j.lease_token + 1, (extract(epoch FROM now()) * 1000000)::bigint),
               lease_until = now() + claim_batch.lease, started_at = now(), worker_id = claim_batch.worker_id
         WHERE j.id = ANY (ARRAY(SELECT picked.id FROM picked))
        RETURNING j.id, j.kind::text, j.payload::jsonb, j.priority, j.attempt, j.max_attempts, j.lease_token,
                  j.run_at, j.created_at, j.started_at, j.lease_until, j.unique_key::text, j.last_error,
                  CASE WHEN j.on_parent_failure IS NOT NULL THEN pgjobq.parents_json(j.id) END;
    ELSE
        RETURN QUERY
        WITH picked AS MATERIALIZED (
            SELECT j.id FROM pgjobq.jobs j
             WHERE j.state = 'queued' AND j.queue = claim_batch.queue AND j.run_at <= now()
               AND (j.priority, j.run_at, j.id) > (claim_batch.after_priority, claim_batch.after_run_at,
                                                    claim_batch.after_id)
             ORDER BY j.priority, j.run_at, j.id
             LIMIT claim_batch.max_jobs
               FOR UPDATE SKIP LOCKED)
        UPDATE pgjobq.jobs j
           SET state = 'running', attempt = j.attempt + 1,
               lease_token = greatest(j.lease_token + 1, (extract(epoch FROM now()) * 1000000)::bigint),
               lease_until = now() + claim_batch.lease, started_at = now(), worker_id = claim_batch.worker_id
         WHERE j.id = ANY (ARRAY(SELECT picked.id FROM picked))
        RETURNING j.id, j.kind::text, j.payload::jsonb, j.priority, j.attempt, j.max_attempts, j.lease_token,
                  j.run_at, j.created_at, j.started_at, j.lease_until, j.unique_key::text, j.last_error,
                  CASE WHEN j.on_parent_failure IS NOT NULL THEN pgjobq.parents_json(j.id) END;
    END IF;

    IF v_limited AND s.rate_limit IS NOT NULL THEN
        GET DIAGNOSTICS v_claimed = ROW_COUNT;
        IF v_claimed > 0 THEN
            UPDATE pgjobq.queues qs SET recent_starts = v_window || array_fill(now(), ARRAY[v_claimed])
             WHERE qs.name = claim_batch.queue;
        END IF;
    END IF;
END
$$;

-- claim: the same claim, from the head of the queue, returning whole rows (the SQL API of version 1).
-- It goes through claim_batch, so it obeys the queue's settings too.  One statement claims; no lock
-- outlives it.
CREATE OR REPLACE FUNCTION pgjobq.claim(
    queue     text,
    max_jobs  integer  DEFAULT 1,
    lease     interval DEFAULT '30 seconds',
    worker_id text     DEFAULT NULL)
RETURNS SETOF pgjobq.jobs
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ids bigint[];
BEGIN
    SELECT array_agg(c.id) INTO v_ids FROM pgjobq.claim_batch(queue, max_jobs, lease, worker_id) c;
    -- A new statement: it sees the rows as the claim left them.
    RETURN QUERY SELECT j.* FROM pgjobq.jobs j WHERE j.id = ANY (v_ids) ORDER BY j.priority, j.run_at, j.id;
END
$$;

-- next_due(queue): seconds until a claim from the queue can return a job (0 or less: now), or NULL
-- when none can until something happens that wakes workers anyway (nothing queued, the queue
-- paused: resuming notifies).  A rate-limited queue whose window is full is due when the oldest start
-- leaves the window.  A queue whose concurrency is used up counts as due now: the worker then polls.
-- It reads at most the first 1000 entries of the claim index, which is exact unless more than 1000
-- jobs are queued across several priorities; a worker polls anyway.
CREATE OR REPLACE FUNCTION pgjobq.next_due(queue text) RETURNS double precision
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s      pgjobq.queues%ROWTYPE;
    v_due  double precision;
    v_full timestamptz;
BEGIN
    SELECT * INTO s FROM pgjobq.queues qs WHERE qs.name = next_due.queue;
    IF s.paused_at IS NOT NULL THEN
        RETURN NULL;
    END IF;
    SELECT extract(epoch FROM min(f.run_at) - now())::double precision INTO v_due
      FROM (SELECT j.run_at FROM pgjobq.jobs j
             WHERE j.state = 'queued' AND j.queue = next_due.queue
             ORDER BY j.priority, j.run_at, j.id
             LIMIT 1000) f;
    IF v_due IS NULL OR s.rate_limit IS NULL THEN
        RETURN v_due;
    END IF;
    -- The window is full: the next start is possible when its oldest start leaves it.
    SELECT min(t) + s.rate_period INTO v_full FROM unnest(s.recent_starts) t WHERE t > now() - s.rate_period
    HAVING count(*) >= s.rate_limit;
    IF v_full IS NOT NULL THEN
        RETURN greatest(v_due, extract(epoch FROM v_full - now())::double precision);
    END IF;
    RETURN v_due;
END
$$;
