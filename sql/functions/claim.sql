-- pgjobq functions: the claim (queued -> running) and what a worker asks before it claims.
--
-- Applied by `pgjobq migrate` with the other files of sql/functions (docs/hacking.md): each function
-- is defined once, here, as it is now.
--
-- The order of a queue: by priority (lower first), then by the claim key greatest(run_at, ready_at)
-- (when the job is due, or when it became claimable if that was later: enqueued, retried, released,
-- its parents done), then by id.  The claim index jobs_ready_idx (queue, priority, key, id) WHERE
-- queue IS NOT NULL matches it (each statement here names the queue).  It holds every job of the
-- table, queued, running or waiting (schema 33): an index whose
-- predicate named the state got a new entry at every claim, and the claim could not write in place.
-- A claim reads the state of each row it walks to, and walks from where nothing claimable is behind
-- (below), so the running jobs, which lie behind, cost it nothing.
--
-- Where a claim starts (docs/design.md, "The claim's cursor").  Claimed and finished jobs leave dead
-- index entries, and while any session holds a snapshot open vacuum can remove none of those that died
-- after it was taken: a claim that starts at the head of a level steps over every one.  So a claim
-- starts each level at a place nothing claimable is behind: the caller's cursor (src/cursor.c), or the
-- level's low-water mark in pgjobq.lows.  Both rest on one fact: a row that becomes claimable has a key
-- no earlier than the database clock when its transaction had already been given its id (ready_at is
-- read after the id: the enqueue functions ask for the id first, and the trigger jobs_ready_stamp, a
-- migration's, does when a job goes back to queued).  So once no transaction older than some moment is still running, every row
-- that is not yet visible will appear after that moment, and a scan may start there.  What a claim
-- that rolled back gives back sits behind every cursor; a low-water mark never passes it (the mark
-- stops at the first row that is queued in the snapshot of the claim that moves it, and a row locked
-- by a running claim is), and every worker claims from the marks once a second.
--
-- The lease token is 62 random bits from the server's strong random source (gen_random_uuid(), which
-- reads pg_strong_random()), plus one: only the claimer learns it, and nobody can work it out.  They
-- are drawn once per claim and XORed with each job's id (a draw per row was a measurable share of a
-- drain: bench/README.md, "What each lever did"): the jobs of one claim share the draw, and only their
-- claimer holds any of them.  It
-- fences every write of the holder (transitions.sql), so it is the holder's secret: a token made of
-- the claim's time (schema 7 to 10: at least the clock in microseconds, the same for every job of a
-- claim) let any worker that knew roughly when a job was claimed complete it with a forged result,
-- trying the few thousand microseconds of the window in one complete_many.  A random token is also
-- never handed out again after a failover to an asynchronous standby that lost the last claim of a
-- job (what the clock was there for: the old holder would pass the fencing check of a lease it never
-- had), whatever the servers' clocks say: two claims of a job draw the same token with a chance of
-- 2^-62.
--
-- A job past its expires_at (docs/queues.md, "Expiry") is stepped over, as a row that is not due: a
-- test of the heap row the scan reads anyway (it is no column of the claim index, which would grow for
-- a column most jobs leave NULL); the sweep (expire_queued, maintenance.sql) ends it cancelled.  The
-- claim judges by its transaction's now(): a claim that began before the job expired may start it.
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

-- running_jobs(queue): the queue's running jobs, found through the alarms of their leases
-- (pgjobq.lease_alarms: every running job is in the alarm of the claim that started it, or in the one
-- the rescue armed again for it, with its token).  No index holds the jobs by state (schema 33), and
-- a scan of a queue's jobs would read its whole backlog: this reads the jobs of the queue's claims of
-- the last few seconds and the ones still running from before (as long as rescue passes run: every
-- worker's, each second; without them, every claim's since the last).  The callers filter on
-- lease_until.  Each job is looked up by its id alone (OFFSET 0 keeps the lookup a probe of the
-- primary key per alarm entry: joined as the planner liked, with statistics taken while no job ran,
-- it read the whole table; and with the queue in the lookup, jobs_ready_idx (queue, ..., id) served
-- it, a walk of the queue's whole range per id: a prune of 90 s under 40 workers).  A job is named
-- by one alarm at a time (the rescue arms a new one only in the transaction that deletes the old).
CREATE OR REPLACE FUNCTION pgjobq.running_jobs(queue text) RETURNS SETOF pgjobq.jobs
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
SET enable_bitmapscan = off
AS $$
    SELECT x.* FROM pgjobq.lease_alarms a
     CROSS JOIN LATERAL unnest(a.ids, a.tokens) AS r(id, token)
     CROSS JOIN LATERAL (SELECT j.* FROM pgjobq.jobs j
                          WHERE j.id = r.id AND j.lease_token = r.token AND j.state = 'running'
                         OFFSET 0) x
     WHERE a.queue = running_jobs.queue AND x.queue = running_jobs.queue
$$;

-- running_fold(queue): how many of the queue's jobs are running with a lease that has not ended (as
-- running_jobs counts them), after folding the queue's alarms that are not due yet into one that
-- names only their jobs still running, each once.  A claim of a queue with a concurrency limit (or a
-- limit per key) calls it, holding the queue's row lock, to count: the alarms hold every claim of the
-- last five seconds, and a count through running_jobs read them all under that lock (36,000 ids at
-- 3,900 jobs/s, 27 ms a claim; bench/README.md, "Queues with a concurrency limit").  Folded at each
-- such claim, they name about as many jobs as run.
--
-- The fold is the rescue's forgetting, done early and without the rescuing.  It takes the queue's
-- alarms that are not due (until > now()) and that it can lock (FOR UPDATE SKIP LOCKED: one that a
-- rescue pass holds is that pass's), deletes them, and in the same statement arms one alarm for their
-- jobs still running under their token, due at the earliest of those jobs' lease ends (as the rescue
-- arms its own), or now if that has passed.  A job not running under its alarm's token never will be
-- again (a claim draws a new token and arms its own alarm), so what is dropped is what the rescue
-- would forget.  A due alarm is the rescue's alone: were the folds to take it, a queue claimed
-- without pause would keep a job whose lease ended in an alarm some claim always held or had just
-- made again, and the rescue would never see it due (a review found this in the first version, which
-- folded every alarm).  So the alarm the fold arms is due when its first lease ends, the claims leave
-- it alone from then on, and the rescue's pass of the next second takes it.  The count adds the
-- running jobs of the alarms the fold did not take, read as running_jobs reads them.
CREATE OR REPLACE FUNCTION pgjobq.running_fold(queue text) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
SET enable_bitmapscan = off
AS $$
DECLARE
    v_n integer;
BEGIN
    -- (PL/pgSQL, not SQL: a SQL function's statement is planned at every call.)
    WITH taken AS MATERIALIZED (
        SELECT a.ctid AS at, a.until, a.ids, a.tokens FROM pgjobq.lease_alarms a
         WHERE a.queue = running_fold.queue AND a.until > now()
           FOR UPDATE SKIP LOCKED),
    gone AS (
        DELETE FROM pgjobq.lease_alarms a WHERE a.ctid = ANY (ARRAY(SELECT t.at FROM taken t))),
    kept AS MATERIALIZED (
        SELECT DISTINCT x.id, x.lease_token, x.lease_until, x.queue
          FROM taken t
         CROSS JOIN LATERAL unnest(t.ids, t.tokens) AS r(id, token)
         CROSS JOIN LATERAL (SELECT j.id, j.lease_token, j.lease_until, j.queue::text AS queue FROM pgjobq.jobs j
                              WHERE j.id = r.id AND j.lease_token = r.token AND j.state = 'running'
                             OFFSET 0) x),
    armed AS (
        INSERT INTO pgjobq.lease_alarms (queue, until, ids, tokens)
        SELECT running_fold.queue, greatest(min(k.lease_until), clock_timestamp()),
               array_agg(k.id), array_agg(k.lease_token)
          FROM kept k HAVING count(*) > 0),
    held AS (
        SELECT x.id
          FROM pgjobq.lease_alarms a
         CROSS JOIN LATERAL unnest(a.ids, a.tokens) AS r(id, token)
         CROSS JOIN LATERAL (SELECT j.id, j.lease_until FROM pgjobq.jobs j
                              WHERE j.id = r.id AND j.lease_token = r.token AND j.state = 'running'
                                AND j.queue = running_fold.queue
                             OFFSET 0) x
         WHERE a.queue = running_fold.queue AND a.ctid <> ALL (ARRAY(SELECT t.at FROM taken t))
           AND x.lease_until > now())
    SELECT (SELECT count(*) FROM kept k WHERE k.queue = running_fold.queue AND k.lease_until > now())
           + (SELECT count(*) FROM held)
      INTO v_n;
    RETURN v_n;
END
$$;

-- claim_next: the claim the worker runs.  Takes up to max_jobs due jobs of one queue, level by level
-- in priority order and within a level in key order, skipping rows others hold (SKIP LOCKED); each
-- becomes running with attempt + 1, a new lease token and a lease until now() + lease.
--
-- Where each level starts:
--   from_levels, from_keys, from_ids   the caller's cursor: for each level listed, after (key, id).
--                                      NULL: every level at its low-water mark, which this claim then
--                                      moves on, and priorities with queued jobs that no enqueue
--                                      recorded (rows inserted by hand) are found (a "low claim").
--   tick_times, tick_xids              the ticks of the caller's earlier claims (the tick row below).
--   gate                               true: the caller keeps the notification gate's promise
--                                      (src/worker.c): a short claim stamps the queue's gate, and a row
--                                      (meta 'gate') comes first among the rows that are not jobs.
--                                      NULL: the row, and no stamp.  false (the default): neither.
-- A level without a cursor starts at its mark.
--
-- Each level's rows are locked as they are found (SKIP LOCKED), and every row locked starts in one
-- UPDATE at the end, written once for the levels and the keyed path.
--
-- Returns a row per claimed job (meta NULL; key = its claim key; in claim order: priority, key, id),
-- then a row per level read to the
-- end of its due jobs (meta 'exhausted', priority = the level), then a last row (meta 'tick'): this
-- claim's tick (key: its moment on the database clock, read before its transaction got an id;
-- tick_xid: that id), its cap (the moment of the latest of the caller's ticks older than every
-- transaction running at this claim's start: every row not yet visible will have a key after it; NULL
-- when none is), limited (the queue's concurrency or rate limit cut the claim short, or a keyed claim
-- (per-key limit, strict order) took less than it could: a slot, or a key, that frees up is worth a
-- claim) and, when it claimed nothing, next_due (seconds until a claim can return
-- a job).  The caller may then move its cursor: a level read to the end to the cap, a level
-- it filled its batch from to the largest key it claimed there or to the cap if that is earlier
-- (src/cursor.c).  A claim under a key limit takes jobs out of key order and reports no cap.
--
-- The function runs without sequential or bitmap scans (the candidates must come from an ordered
-- index scan that stops at the LIMIT, whatever the statistics say) and without JIT: a generic plan's
-- pessimistic estimates once made the probe for unrecorded priorities worth compiling, for far longer
-- than the statement runs (bench/README.md, "What each lever did").
CREATE OR REPLACE FUNCTION pgjobq.claim_next(
    queue       text,
    max_jobs    integer,
    lease       interval,
    worker_id   text,
    from_levels smallint[]    DEFAULT NULL,
    from_keys   timestamptz[] DEFAULT NULL,
    from_ids    bigint[]      DEFAULT NULL,
    tick_times  timestamptz[] DEFAULT NULL,
    tick_xids   bigint[]      DEFAULT NULL,
    lanes       boolean       DEFAULT false,
    gate        boolean       DEFAULT false)
RETURNS TABLE (id bigint, kind text, payload jsonb, priority smallint, attempt integer, max_attempts integer,
               lease_token bigint, run_at timestamptz, created_at timestamptz, started_at timestamptz,
               lease_until timestamptz, unique_key text, last_error text, parents jsonb, traceparent text,
               key timestamptz, meta text, cap timestamptz, tick_xid bigint, next_due double precision,
               limited boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
-- Each statement is planned once per session and its plan kept: planned again at every call (as
-- PL/pgSQL chose), the walk of the levels was a large part of a claim (bench/README.md, "What each
-- lever did").
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    -- The tick's moment first: before this transaction has an id.
    v_tick    timestamptz := clock_timestamp();
    -- 64 random bits per call (drawn once, not once a row); each job's token is them XOR its id.
    v_rand    bigint := ('x' || right(replace(gen_random_uuid()::text, '-', ''), 16))::bit(64)::bigint;
    v_xid     bigint;
    v_cap     timestamptz;
    v_tmax    timestamptz;
    v_lastkey timestamptz;
    v_fus     bigint;
    s         pgjobq.queues%ROWTYPE;
    v_left    integer := max_jobs;
    v_window  timestamptz[];
    v_ids     bigint[];
    v_got     bigint[];
    v_lv      record;
    v_key     timestamptz;
    v_id      bigint;
    v_first   record;
    v_due     double precision;
    v_keyed   boolean := false;
    v_room    integer;
    v_exhausted smallint[] := '{}';
    v_found   smallint[];
    v_low     boolean := false;
    v_lock_timeout text;
    v_snap    pg_snapshot;
    v_pass    integer;
    v_last    text;
    v_from    text;
    v_gcap    timestamptz;
    v_gend    timestamptz;
    v_gst     bigint;
BEGIN
    IF max_jobs IS NULL OR max_jobs < 1 OR max_jobs > 10000 THEN
        RAISE EXCEPTION 'pgjobq.claim: max_jobs must be between 1 and 10000, not %', max_jobs
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF lease IS NULL OR lease <= interval '0' THEN
        RAISE EXCEPTION 'pgjobq.claim: lease must be positive, not %', lease
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF cardinality(from_levels) IS DISTINCT FROM cardinality(from_keys)
       OR cardinality(from_levels) IS DISTINCT FROM cardinality(from_ids)
       OR cardinality(tick_times) IS DISTINCT FROM cardinality(tick_xids) THEN
        RAISE EXCEPTION 'pgjobq.claim: from_levels, from_keys and from_ids (and tick_times and tick_xids) must have '
                        'one element each per level (per tick)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Claim lanes (lanes => true, what the worker asks for under a backlog: its claim is a transaction
    -- of its own): at most two such claims of a queue run at once, on transaction-scoped advisory
    -- locks.  A claim
    -- that started after another committed sees that one's rows as running; claims that overlap do
    -- not: a row one of them read as queued and the other claimed meanwhile is locked in its new
    -- version before the recheck drops it, and that lock is held to the end of the claim, so the other
    -- worker's heartbeat and completion wait for it, and claims wait on one another (log_lock_waits:
    -- "while locking updated version of tuple").  40 processes x 8 threads drain far faster with lanes
    -- (bench/README.md, "Why S5 missed, and the claim lanes").  Not when a claim follows a wakeup:
    -- forty claims woken together would queue for two lanes, and the pickup with them (the same
    -- section).  A claim waits at
    -- most a second for a lane (a lane held longer is a claim stuck on something else), then goes
    -- ahead without one.
    IF lanes
       AND NOT pg_try_advisory_xact_lock(1885825651, hashtext(claim_next.queue || ':0'))
       AND NOT pg_try_advisory_xact_lock(1885825651, hashtext(claim_next.queue || ':1')) THEN
        v_lock_timeout := current_setting('lock_timeout');
        PERFORM set_config('lock_timeout', '1s', true);
        BEGIN
            PERFORM pg_advisory_xact_lock(1885825651, hashtext(claim_next.queue || ':' || (pg_backend_pid() % 2)));
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
        PERFORM set_config('lock_timeout', v_lock_timeout, true);
    END IF;
    v_xid := pg_current_xact_id()::text::bigint;
    -- The cap: the latest tick older than every transaction running now (this one aside).  v_tmax,
    -- the caller's latest tick, is as far as any cap can go.
    SELECT max(t.at) FILTER (WHERE t.xid < pg_snapshot_xmin(pg_current_snapshot())::text::bigint), max(t.at)
      INTO v_cap, v_tmax
      FROM unnest(tick_times, tick_xids) AS t(at, xid);
    -- A snapshot's oldest transaction may be one of another database of the cluster, which cannot
    -- write these jobs.  When the cap lags, ask which transactions of this database are running (and
    -- prepared ones): the latest tick older than all of them will do.  (Their ids are 32 bits there;
    -- this transaction's id gives the epoch.)  Not when the cap is already the caller's latest tick:
    -- each question below sees a subset of the snapshot's transactions, so its cap is never earlier
    -- and never past v_tmax.  That is the common case of a worker whose claims are more than 20 ms
    -- apart (40 processes x 8: 329-470 of a drain's 473 claims asked, 0.25-4.4 ms each).
    IF tick_times IS NOT NULL AND v_tmax > coalesce(v_cap, '-infinity')
       AND (v_cap IS NULL OR v_cap < v_tick - interval '20 milliseconds') THEN
        SELECT max(t.at) INTO v_cap
          FROM unnest(tick_times, tick_xids) AS t(at, xid)
         WHERE t.xid < (SELECT coalesce(min(CASE WHEN x.x <= v_xid % 4294967296 THEN (v_xid / 4294967296) * 4294967296 + x.x
                                                 ELSE (v_xid / 4294967296 - 1) * 4294967296 + x.x END), v_xid)
                          FROM (SELECT a.backend_xid::text::bigint AS x FROM pg_stat_activity a
                                 WHERE a.datid = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
                                   AND a.backend_xid IS NOT NULL
                                UNION ALL
                                SELECT p.transaction::text::bigint FROM pg_prepared_xacts p
                                 WHERE p.database = current_database()) x);
        -- Still a second behind: some transaction of this database has been open for a while (an
        -- idle one, a long batch).  Only those that hold a lock on pgjobq.jobs can still make a job
        -- appear with an early key (one that writes it later gives its rows a later key): ask the
        -- lock manager for them, a heavier question, asked only then.
        IF v_tmax > coalesce(v_cap, '-infinity') AND (v_cap IS NULL OR v_cap < v_tick - interval '1 second') THEN
            SELECT max(t.at) INTO v_cap
              FROM unnest(tick_times, tick_xids) AS t(at, xid)
             WHERE t.xid < (SELECT coalesce(min(CASE WHEN x.x <= v_xid % 4294967296
                                                     THEN (v_xid / 4294967296) * 4294967296 + x.x
                                                     ELSE (v_xid / 4294967296 - 1) * 4294967296 + x.x END), v_xid)
                              FROM (SELECT x.transactionid::text::bigint AS x
                                      FROM pg_locks r
                                      JOIN pg_locks x ON x.virtualtransaction = r.virtualtransaction
                                                     AND x.locktype = 'transactionid' AND x.mode = 'ExclusiveLock'
                                     WHERE r.locktype = 'relation' AND r.relation = 'pgjobq.jobs'::regclass
                                       AND r.database = (SELECT d.oid FROM pg_database d
                                                          WHERE d.datname = current_database())
                                    UNION ALL
                                    SELECT p.transaction::text::bigint FROM pg_prepared_xacts p
                                     WHERE p.database = current_database()) x);
        END IF;
    END IF;

    -- The gate's row reports the cap even where the jobs' order does not let the cursor use it.
    v_gcap := v_cap;
    SELECT * INTO s FROM pgjobq.queues qs WHERE qs.name = claim_next.queue;
    -- No longer a lease than the queue allows (queue_set's max_lease; a day by default): a claim
    -- cannot hold a job for ever.  Refused, not shortened: the caller's heartbeats are timed by the
    -- lease it asked for, and a shorter one would expire under them.
    IF lease > coalesce(s.max_lease, pgjobq.max_lease_default()) THEN
        RAISE EXCEPTION 'pgjobq.claim: a lease of % is longer than queue % allows (max_lease %)', lease,
            claim_next.queue, coalesce(s.max_lease, pgjobq.max_lease_default())
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Ask for a shorter lease (heartbeats renew it), or raise the queue''s max_lease: pgjobq queue set QUEUE --max-lease DURATION.';
    END IF;
    IF FOUND THEN
        IF s.paused_at IS NOT NULL THEN
            RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::jsonb, NULL::smallint, NULL::integer, NULL::integer,
                                NULL::bigint, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
                                NULL::timestamptz, NULL::text, NULL::text, NULL::jsonb, NULL::text, v_tick,
                                'tick'::text, v_cap, v_xid, NULL::double precision, false;
            RETURN;
        END IF;
        IF s.concurrency IS NOT NULL OR s.rate_limit IS NOT NULL OR s.key_concurrency IS NOT NULL
           OR s.strict_order THEN
            IF current_setting('transaction_isolation') <> 'read committed' THEN
                RAISE EXCEPTION 'pgjobq.claim: queue % has a limit; claim from it in a READ COMMITTED transaction', queue
                    USING ERRCODE = 'invalid_transaction_state',
                          HINT = 'A snapshot older than the claim cannot see the jobs other claims just started.';
            END IF;
            -- Limited claims of this queue run one at a time from here to their commit.  The counts
            -- below are new statements, so each sees every claim committed before this lock was given.
            SELECT * INTO s FROM pgjobq.queues qs WHERE qs.name = claim_next.queue FOR UPDATE;
            IF s.paused_at IS NULL THEN
                -- The running jobs, counted as the queue's alarms are folded (running_fold): the
                -- count per key below reads the folded alarms.
                IF s.concurrency IS NOT NULL THEN
                    v_left := least(v_left, s.concurrency - pgjobq.running_fold(claim_next.queue));
                ELSIF s.key_concurrency IS NOT NULL THEN
                    PERFORM pgjobq.running_fold(claim_next.queue);
                END IF;
                IF s.rate_limit IS NOT NULL THEN
                    v_window := ARRAY(SELECT t FROM unnest(s.recent_starts) t WHERE t > now() - s.rate_period ORDER BY t);
                    v_left := least(v_left, s.rate_limit - cardinality(v_window));
                END IF;
            ELSE
                v_left := 0;
            END IF;
            IF v_left <= 0 THEN
                -- Full.  A full rate window frees its first slot when its oldest start leaves it.
                IF s.rate_limit IS NOT NULL AND cardinality(v_window) >= s.rate_limit THEN
                    v_due := extract(epoch FROM v_window[1] + s.rate_period - now());
                END IF;
                RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::jsonb, NULL::smallint, NULL::integer,
                                    NULL::integer, NULL::bigint, NULL::timestamptz, NULL::timestamptz,
                                    NULL::timestamptz, NULL::timestamptz, NULL::text, NULL::text, NULL::jsonb,
                                    NULL::text, v_tick, 'tick'::text, v_cap, v_xid, v_due, true;
                RETURN;
            END IF;
            v_keyed := s.key_concurrency IS NOT NULL OR s.strict_order;
        END IF;
    END IF;
    v_room := v_left;

    IF v_keyed AND s.strict_order THEN
        -- Strict order per key (docs/queues.md): a key's job starts only when it is the first of its
        -- key still in line (waiting, queued or running: the lowest id on jobs_sequence_idx), is due,
        -- and no failed job blocks the key (sequence_blocks).  So a key whose first job runs, backs off
        -- before a retry, sleeps or waits for its parents lets nothing of it start.  The claims of the
        -- queue run one at a time (the queue's row, locked above) and these statements read in
        -- snapshots taken after that lock, so two claims cannot start two jobs of a key.  The keys are
        -- walked from the queue's sequence_cursor to the last, then from the first round to it, each
        -- key's first job in one probe, and each walk stops when it has found enough: every key gets its
        -- turn, whatever their number.
        FOR v_pass IN 1 .. 2 LOOP
            EXIT WHEN v_left <= 0 OR (v_pass = 2 AND s.sequence_cursor IS NULL);
            -- Where the walk starts: after the cursor, then from the first key ('' is before every key,
            -- which has a character at least).  A bound of the index scan, not a filter: an OR here had
            -- the first probe read every key entry of the queue (20 ms at 100,000 queued jobs).
            v_from := CASE WHEN v_pass = 1 THEN coalesce(s.sequence_cursor, '') ELSE '' END;
            v_got := ARRAY(
                WITH RECURSIVE keys(k) AS (
                    (SELECT j.concurrency_key::text FROM pgjobq.jobs j
                      WHERE j.state = 'queued' AND j.queue = claim_next.queue AND j.concurrency_key IS NOT NULL
                        AND j.concurrency_key > v_from
                      ORDER BY j.concurrency_key LIMIT 1)
                    UNION ALL
                    SELECT (SELECT j.concurrency_key::text FROM pgjobq.jobs j
                             WHERE j.state = 'queued' AND j.queue = claim_next.queue AND j.concurrency_key > keys.k
                             ORDER BY j.concurrency_key LIMIT 1)
                      FROM keys
                     WHERE keys.k IS NOT NULL AND (v_pass = 1 OR keys.k <= s.sequence_cursor))
                SELECT h.id
                  FROM keys
                 CROSS JOIN LATERAL (SELECT j.id, j.state, greatest(j.run_at, j.ready_at) AS due, j.expires_at
                                       FROM pgjobq.jobs j
                                      WHERE j.queue = claim_next.queue AND j.concurrency_key = keys.k
                                        AND j.state IN ('waiting', 'queued', 'running')
                                      ORDER BY j.id LIMIT 1) h
                 WHERE keys.k IS NOT NULL AND (v_pass = 1 OR keys.k <= s.sequence_cursor)
                   AND h.state = 'queued' AND h.due <= now() AND (h.expires_at IS NULL OR h.expires_at > now())
                   AND NOT EXISTS (SELECT 1 FROM pgjobq.sequence_blocks b
                                    WHERE b.queue = claim_next.queue AND b.key = keys.k)
                 LIMIT v_left);
            SELECT array_agg(p.id) INTO v_got
              FROM (SELECT j.id FROM pgjobq.jobs j WHERE j.id = ANY (v_got) AND j.state = 'queued'
                       FOR UPDATE SKIP LOCKED) p;
            IF v_got IS NOT NULL THEN
                -- Where this walk got to: the next claim's starts after it.
                v_last := (SELECT max(j.concurrency_key::text) FROM pgjobq.jobs j WHERE j.id = ANY (v_got));
            END IF;
            v_ids := v_ids || v_got;
            v_left := v_left - coalesce(cardinality(v_got), 0);
        END LOOP;
        IF v_last IS NOT NULL THEN
            UPDATE pgjobq.queues qs SET sequence_cursor = v_last WHERE qs.name = claim_next.queue;
        END IF;
        -- Jobs without a key run as in any queue.  A strict queue's jobs should all have one (pg-boss's
        -- key_strict_fifo requires it): these are looked for among the queue's oldest due jobs only, so
        -- that a claim does not read a long line of keys' jobs held back behind their first.
        IF v_left > 0 THEN
            SELECT array_agg(p.id) INTO v_got
              FROM (SELECT j.id FROM pgjobq.jobs j
                     WHERE j.id = ANY (ARRAY(
                               SELECT o.id FROM (SELECT j.id, j.concurrency_key FROM pgjobq.jobs j
                                                  WHERE j.state = 'queued' AND j.queue = claim_next.queue
                                                    AND greatest(j.run_at, j.ready_at) <= now()
                                                  ORDER BY j.priority, greatest(j.run_at, j.ready_at), j.id
                                                  LIMIT 4 * v_left + 100) o
                                WHERE o.concurrency_key IS NULL))
                       AND j.state = 'queued' AND j.concurrency_key IS NULL
                       AND (j.expires_at IS NULL OR j.expires_at > now())
                     ORDER BY j.priority, greatest(j.run_at, j.ready_at), j.id
                     LIMIT v_left
                       FOR UPDATE SKIP LOCKED) p;
            v_ids := v_ids || v_got;
            v_left := v_left - coalesce(cardinality(v_got), 0);
        END IF;
        v_cap := NULL;
    ELSIF v_keyed THEN
        -- Per key: each key's due jobs, at most its free slots, then round-robin over the keys (every
        -- key's first job before any key's second); jobs without a key compete as their own.  Not in
        -- key order, so this claim moves no cursor (it reports no cap).
        WITH RECURSIVE keys(k) AS (
            (SELECT j.concurrency_key::text FROM pgjobq.jobs j
              WHERE j.state = 'queued' AND j.queue = claim_next.queue AND j.concurrency_key IS NOT NULL
              ORDER BY j.concurrency_key LIMIT 1)
            UNION ALL
            SELECT (SELECT j.concurrency_key::text FROM pgjobq.jobs j
                     WHERE j.state = 'queued' AND j.queue = claim_next.queue AND j.concurrency_key IS NOT NULL
                       AND j.concurrency_key > keys.k
                     ORDER BY j.concurrency_key LIMIT 1)
              FROM keys WHERE keys.k IS NOT NULL),
        -- Each key's running jobs, counted once (MATERIALIZED: inlined, the count ran once per key,
        -- 0.2 ms each: 209 of a claim's 258 ms with 1,000 keys) and joined to the keys by hash.
        busy AS MATERIALIZED (
            SELECT j.concurrency_key::text AS k, count(*) AS n FROM pgjobq.running_jobs(claim_next.queue) j
             WHERE j.lease_until > now() AND j.concurrency_key IS NOT NULL
             GROUP BY 1),
        cand AS (
            SELECT c.id, c.priority, c.k, c.rn
              FROM keys
              LEFT JOIN busy b ON b.k = keys.k
              CROSS JOIN LATERAL (
                  SELECT j.id, j.priority, greatest(j.run_at, j.ready_at) AS k,
                         row_number() OVER (ORDER BY j.priority, greatest(j.run_at, j.ready_at), j.id) AS rn
                    FROM pgjobq.jobs j
                   WHERE j.state = 'queued' AND j.queue = claim_next.queue AND j.concurrency_key = keys.k
                     AND greatest(j.run_at, j.ready_at) <= now()
                     AND (j.expires_at IS NULL OR j.expires_at > now())
                   ORDER BY j.priority, greatest(j.run_at, j.ready_at), j.id
                   LIMIT greatest(s.key_concurrency - coalesce(b.n, 0), 0)) c
             WHERE keys.k IS NOT NULL
            UNION ALL
            SELECT u.id, u.priority, u.k, row_number() OVER (ORDER BY u.priority, u.k, u.id)
              FROM (SELECT j.id, j.priority, greatest(j.run_at, j.ready_at) AS k FROM pgjobq.jobs j
                     WHERE j.state = 'queued' AND j.queue = claim_next.queue AND j.concurrency_key IS NULL
                       AND greatest(j.run_at, j.ready_at) <= now()
                       AND (j.expires_at IS NULL OR j.expires_at > now())
                     ORDER BY j.priority, greatest(j.run_at, j.ready_at), j.id
                     LIMIT v_left) u),
        picked AS MATERIALIZED (
            SELECT j.id FROM pgjobq.jobs j
             WHERE j.id = ANY (ARRAY(SELECT cand.id FROM cand ORDER BY cand.rn, cand.priority, cand.k, cand.id
                                      LIMIT v_left))
               AND j.state = 'queued'
               FOR UPDATE SKIP LOCKED)
        SELECT array_agg(picked.id) INTO v_ids FROM picked;
        v_left := v_left - coalesce(cardinality(v_ids), 0);
        v_cap := NULL;
    ELSE
        -- A claim without a cursor does the low-water marks' work (finds unrecorded priorities, moves
        -- the marks on) when nobody has for a second: it is a claim a worker makes once a second, and
        -- one the SQL API may make in a loop.
        IF from_levels IS NULL THEN
            v_low := NOT EXISTS (SELECT 1 FROM pgjobq.levels l
                                  CROSS JOIN LATERAL (SELECT x.at FROM pgjobq.lows x
                                                       WHERE x.queue = claim_next.queue AND x.priority = l.priority
                                                       ORDER BY x.at DESC LIMIT 1) lo
                                  WHERE l.queue = claim_next.queue AND lo.at > clock_timestamp() - interval '1 second');
        END IF;
        IF v_low THEN
            -- Priorities with queued jobs that no enqueue recorded (rows inserted by hand, or an enqueue
            -- whose recording another transaction still holds): one probe per priority not recorded, at
            -- the head of an index range no claim has taken from.  The probe of a recorded level, whose
            -- head holds every row claimed there, must not run at all: CASE, and OFFSET 0 so that the
            -- planner cannot turn the probes into one hashed scan of every queued row of the queue.
            -- The levels found are claimed from now, recorded or not.
            SELECT array_agg(g.p::smallint) INTO v_found
               FROM generate_series(-100, 100) AS g(p)
              WHERE CASE WHEN EXISTS (SELECT 1 FROM pgjobq.levels l
                                       WHERE l.queue = claim_next.queue AND l.priority = g.p) THEN false
                         ELSE EXISTS (SELECT 1 FROM pgjobq.jobs j
                                       WHERE j.state = 'queued' AND j.queue = claim_next.queue AND j.priority = g.p
                                      OFFSET 0)
                    END;
            IF v_found IS NOT NULL THEN
                PERFORM pgjobq.levels_record(array_fill(claim_next.queue, ARRAY[cardinality(v_found)]), v_found,
                                             false);
            END IF;
        END IF;
        FOR v_lv IN
            SELECT l.priority AS p, f.key AS fkey, f.id AS fid, lo.key AS lkey, lo.id AS lid, r.frontier,
                   pg_sequence_last_value(r.frontier) AS fr
              FROM (SELECT x.priority FROM pgjobq.levels x WHERE x.queue = claim_next.queue
                    UNION SELECT unnest(v_found)) l
              LEFT JOIN pgjobq.levels r ON r.queue = claim_next.queue AND r.priority = l.priority
              LEFT JOIN LATERAL (SELECT from_keys[o] AS key, from_ids[o] AS id
                                   FROM generate_subscripts(from_levels, 1) o
                                  WHERE from_levels[o] = l.priority LIMIT 1) f ON true
              LEFT JOIN LATERAL (SELECT x.key, x.id FROM pgjobq.lows x
                                  WHERE x.queue = claim_next.queue AND x.priority = l.priority
                                  ORDER BY x.at DESC LIMIT 1) lo ON true
             ORDER BY l.priority
        LOOP
            -- Start at the latest of the caller's cursor, the low-water mark and the level's frontier:
            -- each is behind nothing that can still be claimed.  A claim without a cursor starts at
            -- the mark, so that it finds what a claim that rolled back gave back.
            v_key := coalesce(v_lv.lkey, '-infinity');
            v_id := coalesce(v_lv.lid, 0);
            IF v_lv.fkey IS NOT NULL AND (v_lv.fkey, v_lv.fid) > (v_key, v_id) THEN
                v_key := v_lv.fkey;
                v_id := v_lv.fid;
            END IF;
            IF from_levels IS NOT NULL AND v_lv.fr IS NOT NULL
               AND ('epoch'::timestamptz + v_lv.fr * interval '1 microsecond', 0::bigint) > (v_key, v_id) THEN
                v_key := 'epoch'::timestamptz + v_lv.fr * interval '1 microsecond';
                v_id := 0;
            END IF;
            -- The caller's cursor goes to the frontier, if it is further: claimers that run together
            -- then start after one another's claims rather than step over them (40 processes of 8
            -- threads each read 16,000 pages a claim without it).  A worker's claim has put it there
            -- already (below); this is for a cursor no claim reported (an SQL caller's own, or one
            -- moved without a cap).
            IF v_lv.fkey IS NOT NULL AND v_lv.frontier IS NOT NULL AND v_lv.fkey > '-infinity'
               AND (extract(epoch FROM v_lv.fkey) * 1000000)::bigint > coalesce(v_lv.fr, 0) THEN
                PERFORM setval(v_lv.frontier, (extract(epoch FROM v_lv.fkey) * 1000000)::bigint);
            END IF;
            IF v_low AND v_cap IS NOT NULL THEN
                -- The mark moves on: to the first row that is queued in this snapshot (one that a running
                -- claim has locked is: it may roll back), or to the cap, whichever is earlier.  Recorded
                -- even when it stays, as the moment the work was last done.
                SELECT greatest(j.run_at, j.ready_at) AS key, j.id INTO v_first FROM pgjobq.jobs j
                 WHERE j.state = 'queued' AND j.queue = claim_next.queue AND j.priority = v_lv.p
                   AND (greatest(j.run_at, j.ready_at), j.id) > (v_key, v_id)
                 ORDER BY greatest(j.run_at, j.ready_at), j.id LIMIT 1;
                IF v_first.key IS NULL OR (v_cap, 0::bigint) < (v_first.key, v_first.id) THEN
                    v_first.key := v_cap;
                    v_first.id := 0;
                ELSE
                    -- The mark is exclusive: just before the first queued row.
                    v_first.id := v_first.id - 1;
                END IF;
                IF (v_first.key, v_first.id) < (v_key, v_id) THEN
                    -- (Another claimer's cap was later than this one's: the mark never goes back.)
                    v_first.key := v_key;
                    v_first.id := v_id;
                END IF;
                INSERT INTO pgjobq.lows (queue, priority, key, id) VALUES (claim_next.queue, v_lv.p, v_first.key, v_first.id);
            END IF;
            -- A row is stepped over without an attempt to lock it when its xmax is a transaction that
            -- was running when this claim's snapshot was taken, or began since: that one holds it
            -- (SKIP LOCKED would skip it), or claimed it since and committed, and then the attempt
            -- would lock the row's new, running version and hold that lock to the end of this claim,
            -- so the owner's heartbeat and completion would wait for it (the race the lanes above
            -- narrow).  Any other xmax holds nothing: the writer's own (xmax = xmin: a retry, a rescue
            -- or a workflow's release locks the row before it updates it), or a transaction that
            -- ended before the snapshot (it locked the row without changing it, or rolled back: an
            -- update it committed would have hidden this version).  v_snap is taken just before the
            -- statement's own snapshot, so a transaction that ended in between is stepped over too,
            -- and the next claim takes its row.  The 32-bit xmax gets its epoch from this
            -- transaction's id (the nearest one, either side).
            v_snap := pg_current_snapshot();
            SELECT array_agg(p.id), max(p.key) INTO v_got, v_lastkey
              FROM (SELECT j.id, greatest(j.run_at, j.ready_at) AS key FROM pgjobq.jobs j
                     WHERE j.state = 'queued' AND j.queue = claim_next.queue AND j.priority = v_lv.p
                       AND greatest(j.run_at, j.ready_at) <= now()
                       AND (greatest(j.run_at, j.ready_at), j.id) > (v_key, v_id)
                       AND (j.expires_at IS NULL OR j.expires_at > now())
                       AND (j.xmax = '0'::xid OR j.xmax = j.xmin
                            OR pg_visible_in_snapshot((v_xid + (((j.xmax::text::bigint - v_xid) % 4294967296)
                                                                 + 6442450944) % 4294967296 - 2147483648)::text::xid8,
                                                      v_snap))
                     ORDER BY greatest(j.run_at, j.ready_at), j.id
                     LIMIT v_left
                       FOR UPDATE SKIP LOCKED) p;
            v_ids := v_ids || v_got;
            v_left := v_left - coalesce(cardinality(v_got), 0);
            IF v_left > 0 THEN
                v_exhausted := v_exhausted || v_lv.p;
            END IF;
            -- The frontier goes now where the caller's cursor will go when this claim returns
            -- (src/cursor.c): to the cap if the level was read to its end, else to the last row
            -- claimed, at most the cap.  Set at the caller's next claim instead (above), it lagged one
            -- claim per worker, and each claim of 40 workers stepped over the running rows of the 39
            -- claims before it.  Safe as the cursor is: what this claim holds is running or, if it
            -- rolls back, behind every cursor, where the claims from the marks find it.
            IF v_cap IS NOT NULL AND v_lv.frontier IS NOT NULL THEN
                v_fus := (extract(epoch FROM CASE WHEN v_left > 0 THEN v_cap ELSE least(v_lastkey, v_cap) END)
                          * 1000000)::bigint;
                IF v_fus > coalesce(pg_sequence_last_value(v_lv.frontier), 0) THEN
                    PERFORM setval(v_lv.frontier, v_fus);
                END IF;
            END IF;
            EXIT WHEN v_left = 0;
        END LOOP;
    END IF;

    -- The rows locked above (the keyed path's, or each level's) start, in one statement, and are
    -- returned in claim order (priority, then key, then id).
    IF v_ids IS NOT NULL THEN
        RETURN QUERY
        WITH started AS (
            UPDATE pgjobq.jobs j
               SET state = 'running', attempt = j.attempt + 1,
                   lease_token = ((v_rand # j.id) & 4611686018427387903) + 1,
                   lease_until = now() + claim_next.lease, started_at = now(), worker_id = claim_next.worker_id
             WHERE j.id = ANY (v_ids)
            RETURNING j.id, j.kind::text AS kind, j.payload::jsonb AS payload, j.priority, j.attempt,
                      j.max_attempts, j.lease_token, j.run_at, j.created_at, j.started_at, j.lease_until,
                      j.unique_key::text AS unique_key, j.last_error,
                      CASE WHEN j.on_parent_failure IS NOT NULL THEN pgjobq.parents_json(j.id) END AS parents,
                      greatest(j.run_at, j.ready_at) AS key, j.traceparent::text AS traceparent),
        -- The lease's alarm (sql/033_hot_claim.sql): one row for the claim.  No index of pgjobq.jobs
        -- holds state or lease_until, so the UPDATE above writes each job's new version in place
        -- (HOT) and no index entry.  The alarm is due 5 seconds after the claim by the clock at its
        -- end, or at the lease's end if that is sooner (never after it): the rescue pass of a second
        -- or two later forgets the jobs finished by then, which are most of them, and arms one alarm
        -- for the rest at their leases' end.  So a queue's alarms hold its claims of the last few seconds
        -- and its running jobs, which is what running_jobs reads.
        armed AS (
            INSERT INTO pgjobq.lease_alarms (queue, until, ids, tokens)
            SELECT claim_next.queue, least(now() + claim_next.lease, clock_timestamp() + interval '5 seconds'),
                   array_agg(st.id), array_agg(st.lease_token)
              FROM started st HAVING count(*) > 0)
        SELECT st.id, st.kind, st.payload, st.priority, st.attempt, st.max_attempts, st.lease_token, st.run_at,
               st.created_at, st.started_at, st.lease_until, st.unique_key, st.last_error, st.parents,
               st.traceparent, st.key, NULL::text, NULL::timestamptz, NULL::bigint, NULL::double precision,
               NULL::boolean
          FROM started st
         ORDER BY st.priority, st.key, st.id;
    END IF;
    IF s.rate_limit IS NOT NULL AND v_room > v_left THEN
        UPDATE pgjobq.queues qs SET recent_starts = v_window || array_fill(now(), ARRAY[v_room - v_left])
         WHERE qs.name = claim_next.queue;
    END IF;
    IF v_left = v_room THEN
        -- Nothing claimed: when is the next job due?  One probe per level, just after now() (what is due
        -- already is held by others: the poll covers it).
        SELECT extract(epoch FROM min(nx.key) - now()) INTO v_due
          FROM pgjobq.levels l
          CROSS JOIN LATERAL (SELECT greatest(j.run_at, j.ready_at) AS key FROM pgjobq.jobs j
                               WHERE j.state = 'queued' AND j.queue = claim_next.queue AND j.priority = l.priority
                                 AND greatest(j.run_at, j.ready_at) > now()
                               ORDER BY greatest(j.run_at, j.ready_at), j.id LIMIT 1) nx
         WHERE l.queue = claim_next.queue;
    END IF;
    IF gate IS NOT FALSE THEN
        -- The notification gate (sql/032_notify_gate.sql): a claim that took jobs, but fewer than it
        -- asked for and could take (not cut short by a limit or a key), read the queue's due jobs to
        -- their end, so its caller will claim again after the window: producers may skip their
        -- notifications until then.  Unless a stamp younger than half the window holds the gate shut
        -- already: few promises at a time per queue, so that not every worker that found the queue
        -- drained claims again each window.  (A worker claims again at half its window, and a claim
        -- that finds jobs then stamps again: under steady load the gate stays shut, with no gap
        -- between one window and the next in which every producer notifies.)  A row (meta 'gate') tells the caller: key, when the window ends (NULL:
        -- no stamp); cap, this claim's cap, also where a keyed claim reports none in its tick row;
        -- next_due, the window in seconds.
        -- gate => NULL: the row only (the window), no stamp: a worker whose queue's notifications come
        -- slower than one a window asks so (src/policy.c, pgjobq__gate_wanted).
        IF gate AND v_left > 0 AND v_left < v_room AND NOT v_keyed THEN
            v_gend := clock_timestamp();
            v_gst := pg_sequence_last_value(pgjobq.notify_gate_slot(claim_next.queue));
            IF NOT pgjobq.notify_gate_shut(v_gst, claim_next.queue, pgjobq.notify_gate_window() / 2) THEN
                PERFORM setval(pgjobq.notify_gate_slot(claim_next.queue),
                               (pgjobq.notify_gate_tick(v_gend) << 16) | pgjobq.notify_gate_tag(claim_next.queue));
                v_gend := v_gend + pgjobq.notify_gate_window();
            ELSE
                v_gend := NULL;
            END IF;
        END IF;
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::jsonb, NULL::smallint, NULL::integer, NULL::integer,
                            NULL::bigint, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
                            NULL::text, NULL::text, NULL::jsonb, NULL::text, v_gend, 'gate'::text, v_gcap,
                            NULL::bigint, extract(epoch FROM pgjobq.notify_gate_window())::double precision,
                            NULL::boolean;
    END IF;
    RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::jsonb, x.p, NULL::integer, NULL::integer,
                        NULL::bigint, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
                        NULL::text, NULL::text, NULL::jsonb, NULL::text, NULL::timestamptz, 'exhausted'::text,
                        NULL::timestamptz, NULL::bigint, NULL::double precision, NULL::boolean
                   FROM unnest(v_exhausted) AS x(p)
                 UNION ALL
                 SELECT NULL::bigint, NULL::text, NULL::jsonb, NULL::smallint, NULL::integer, NULL::integer,
                        NULL::bigint, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
                        NULL::text, NULL::text, NULL::jsonb, NULL::text, v_tick, 'tick'::text, v_cap, v_xid, v_due,
                        coalesce(v_room < max_jobs AND (s.concurrency IS NOT NULL OR s.rate_limit IS NOT NULL), false)
                        OR (v_keyed AND v_left > 0);
END
$$;

-- claim_batch: claim_next's jobs without its other rows, for SQL callers and libraries of version 9.
-- Returns only what a worker needs, and a job that had parents comes with their results (`parents`:
-- NULL for every other job; it is the last column, so a library of version 7, which names the columns
-- it reads, is not affected).
--
-- after_priority, after_run_at, after_id (all three, or none): start that level after this key (the
-- claim key, greatest(run_at, ready_at), and the id), as claim_next's cursor for one level; other
-- levels start at their low-water marks.  Without them the claim starts every level at its mark and
-- moves the marks on.
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
               lease_until timestamptz, unique_key text, last_error text, parents jsonb, traceparent text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF (after_priority IS NULL) <> (after_run_at IS NULL) OR (after_priority IS NULL) <> (after_id IS NULL) THEN
        RAISE EXCEPTION 'pgjobq.claim: give all of after_priority, after_run_at and after_id, or none'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    SELECT c.id, c.kind, c.payload, c.priority, c.attempt, c.max_attempts, c.lease_token, c.run_at, c.created_at,
           c.started_at, c.lease_until, c.unique_key, c.last_error, c.parents, c.traceparent
      FROM pgjobq.claim_next(claim_batch.queue, claim_batch.max_jobs, claim_batch.lease, claim_batch.worker_id,
                             CASE WHEN after_priority IS NOT NULL THEN ARRAY[after_priority] END,
                             CASE WHEN after_priority IS NOT NULL THEN ARRAY[after_run_at] END,
                             CASE WHEN after_priority IS NOT NULL THEN ARRAY[after_id] END) c
     WHERE c.meta IS NULL;
END
$$;

-- claim: the same claim, from the low-water marks, returning whole rows (the SQL API of version 1).
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
    RETURN QUERY SELECT j.* FROM pgjobq.jobs j WHERE j.id = ANY (v_ids)
                  ORDER BY j.priority, greatest(j.run_at, j.ready_at), j.id;
END
$$;

-- next_due(queue): seconds until a claim from the queue can return a job (0 or less: now), or NULL
-- when none can until something happens that wakes workers anyway (nothing queued, the queue
-- paused: resuming notifies).  A rate-limited queue whose window is full is due when the oldest start
-- leaves the window.  A queue whose concurrency is used up counts as due now: the worker then polls.
-- Each level is read from its low-water mark: the first queued row of each, whoever holds it.
CREATE OR REPLACE FUNCTION pgjobq.next_due(queue text) RETURNS double precision
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
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
    SELECT extract(epoch FROM min(f.key) - now())::double precision INTO v_due
      FROM pgjobq.levels l
      LEFT JOIN LATERAL (SELECT x.key, x.id FROM pgjobq.lows x
                          WHERE x.queue = next_due.queue AND x.priority = l.priority
                          ORDER BY x.at DESC LIMIT 1) lo ON true
      CROSS JOIN LATERAL (SELECT greatest(j.run_at, j.ready_at) AS key FROM pgjobq.jobs j
                           WHERE j.state = 'queued' AND j.queue = next_due.queue AND j.priority = l.priority
                             AND (greatest(j.run_at, j.ready_at), j.id)
                                 > (coalesce(lo.key, '-infinity'), coalesce(lo.id, 0))
                           ORDER BY greatest(j.run_at, j.ready_at), j.id LIMIT 1) f
     WHERE l.queue = next_due.queue;
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
