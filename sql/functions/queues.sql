-- pgjobq functions: queue settings (pgjobq.queues): pause, resume, limits, and the list of queues.
-- The claim enforces the settings (claim.sql).
--
-- Applied by `pgjobq migrate` with the other files of sql/functions (docs/hacking.md): each function
-- is defined once, here, as it is now.

-- queue_pause(queue, reason): the queue's claims return nothing from now on, on every worker, until
-- queue_resume.  Jobs already running go on under their leases.  Returns false when the queue was
-- paused already (its reason is then replaced).
CREATE OR REPLACE FUNCTION pgjobq.queue_pause(queue text, reason text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_was timestamptz;
BEGIN
    SELECT qs.paused_at INTO v_was FROM pgjobq.queues qs WHERE qs.name = queue_pause.queue FOR UPDATE;
    INSERT INTO pgjobq.queues AS qs (name, paused_at, pause_reason)
    VALUES (queue_pause.queue, now(), left(reason, 1024))
    ON CONFLICT (name) DO UPDATE
       SET paused_at = coalesce(qs.paused_at, now()), pause_reason = left(queue_pause.reason, 1024),
           updated_at = now();
    RETURN v_was IS NULL;
END
$$;

-- queue_resume(queue): claims from the queue return jobs again; workers are woken.  Returns false when
-- the queue was not paused.
CREATE OR REPLACE FUNCTION pgjobq.queue_resume(queue text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE pgjobq.queues qs SET paused_at = NULL, pause_reason = NULL, updated_at = now()
     WHERE qs.name = queue_resume.queue AND qs.paused_at IS NOT NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- Without the gate (docs/design.md, "The notification gate"): a worker's promise ends at a claim
    -- of the paused queue, so a stamp made just before the pause holds nobody to claim.
    PERFORM pg_notify('pgjobq', queue);
    RETURN true;
END
$$;

-- max_lease_default(): the longest lease a claim or a heartbeat may take in a queue whose max_lease
-- is not set (queue_set).  A lease is renewed by heartbeats while its job runs, so a long one buys
-- nothing but the time a job stays held after its worker is gone; a day is longer than any lease a
-- worker needs (the worker's default is a minute) and short enough that a claim cannot hold a job for
-- ever (claim('q', 1, '1000 years', ...) held one until 3026, and a queue with concurrency 1 with it).
CREATE OR REPLACE FUNCTION pgjobq.max_lease_default() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT interval '1 day' $$;

-- queue_set(queue, settings): changes the settings named in a JSON object and leaves the others;
-- null removes a limit.  Keys: "concurrency" (1..1000000), "key_concurrency" (1..1000000: jobs of one
-- concurrency key running at once), "rate_limit" (1..10000) with
-- "rate_period" (an interval, 1 ms to 1 day; the two go together), "max_lease" (an interval, 1 second
-- to 365 days: the longest lease a claim may ask for, and a heartbeat renew, in this queue; null: the
-- default, max_lease_default()), "dead_letter" (a queue name: where a job of this queue that fails for
-- good goes, as a new job; docs/queues.md, "Dead letters"), "expire_after" (an interval, 1 second to
-- 365 days: the expiry of the jobs enqueued into the queue from now on without one of their own,
-- counted from their run_at; docs/queues.md, "Expiry"), "strict_order" (true: the jobs of a
-- concurrency key run one at a time in the order of their ids, and one that fails for good blocks its
-- key; docs/queues.md, "Strict order per key"; null or false: off), "priority_aging" (an interval, 1
-- second to 365 days: a queued job ready that long at its priority is raised one step, again after
-- each further interval; null: off; docs/queues.md, "Priority aging").  Workers are woken, as a limit
-- may have been raised.
--
-- A dead-letter setting that would make a cycle (the queue itself, or a queue whose dead letters
-- lead back to this one) is refused (22023).  Two calls that would close a cycle between them (a -> b
-- and b -> a at once) each check in a new statement after a transaction lock that every change of a
-- dead-letter setting takes, so the second sees the first's commit.
CREATE OR REPLACE FUNCTION pgjobq.queue_set(queue text, settings jsonb) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    k      text;
    v_dead text;
BEGIN
    IF settings IS NULL OR jsonb_typeof(settings) <> 'object' THEN
        RAISE EXCEPTION 'pgjobq.queue_set: settings must be a JSON object'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR k IN SELECT jsonb_object_keys(settings) LOOP
        IF k NOT IN ('concurrency', 'key_concurrency', 'rate_limit', 'rate_period', 'max_lease', 'dead_letter',
                     'expire_after', 'strict_order', 'priority_aging') THEN
            RAISE EXCEPTION 'pgjobq.queue_set: unknown setting "%"', k
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'The settings are concurrency, key_concurrency, rate_limit, rate_period, max_lease, '
                             'dead_letter, expire_after, strict_order and priority_aging.';
        END IF;
    END LOOP;
    IF settings ? 'strict_order' AND jsonb_typeof(settings -> 'strict_order') NOT IN ('boolean', 'null') THEN
        RAISE EXCEPTION 'pgjobq.queue_set: strict_order must be true or false, not %', settings -> 'strict_order'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF settings ? 'dead_letter' AND jsonb_typeof(settings -> 'dead_letter') <> 'null' THEN
        v_dead := settings ->> 'dead_letter';
        IF jsonb_typeof(settings -> 'dead_letter') <> 'string'
           OR NOT (length(v_dead) BETWEEN 1 AND 64 AND v_dead ~ '^[A-Za-z][A-Za-z0-9_.:-]*$') THEN
            RAISE EXCEPTION 'pgjobq.queue_set: dead_letter must be a queue name, not %', settings -> 'dead_letter'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'A name is a letter, then up to 63 letters, digits and _ . : -';
        END IF;
        -- One change of a dead-letter setting at a time, and the chain read after the lock (a new
        -- statement: READ COMMITTED sees what the one before committed).
        PERFORM pg_advisory_xact_lock(1885825649, 26);
        IF EXISTS (WITH RECURSIVE chain(name, depth) AS (
                       SELECT v_dead::text, 1
                       UNION ALL
                       SELECT q.dead_letter::text, c.depth + 1 FROM chain c JOIN pgjobq.queues q ON q.name = c.name
                        WHERE q.dead_letter IS NOT NULL AND c.depth < 1000)
                   SELECT 1 FROM chain c WHERE c.name = queue_set.queue) THEN
            RAISE EXCEPTION 'pgjobq.queue_set: dead letters of "%" to "%" would come back to "%": a cycle', queue,
                v_dead, queue
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'A dead-letter queue may have its own, but the chain must end.';
        END IF;
    END IF;
    IF (settings ->> 'max_lease')::interval NOT BETWEEN interval '1 second' AND interval '365 days' THEN
        RAISE EXCEPTION 'pgjobq.queue_set: max_lease is %: it must be between 1 second and 365 days',
            (settings ->> 'max_lease')::interval USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (settings ->> 'expire_after')::interval NOT BETWEEN interval '1 second' AND interval '365 days' THEN
        RAISE EXCEPTION 'pgjobq.queue_set: expire_after is %: it must be between 1 second and 365 days',
            (settings ->> 'expire_after')::interval USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (settings ->> 'priority_aging')::interval NOT BETWEEN interval '1 second' AND interval '365 days' THEN
        RAISE EXCEPTION 'pgjobq.queue_set: priority_aging is %: it must be between 1 second and 365 days',
            (settings ->> 'priority_aging')::interval USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (settings ? 'rate_limit') <> (settings ? 'rate_period') THEN
        RAISE EXCEPTION 'pgjobq.queue_set: give rate_limit and rate_period together'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO pgjobq.queues (name) VALUES (queue_set.queue) ON CONFLICT (name) DO NOTHING;
    UPDATE pgjobq.queues qs
       SET concurrency = CASE WHEN settings ? 'concurrency' THEN (settings ->> 'concurrency')::integer
                              ELSE qs.concurrency END,
           key_concurrency = CASE WHEN settings ? 'key_concurrency' THEN (settings ->> 'key_concurrency')::integer
                                  ELSE qs.key_concurrency END,
           rate_limit = CASE WHEN settings ? 'rate_limit' THEN (settings ->> 'rate_limit')::integer
                             ELSE qs.rate_limit END,
           rate_period = CASE WHEN settings ? 'rate_period' THEN (settings ->> 'rate_period')::interval
                              ELSE qs.rate_period END,
           max_lease = CASE WHEN settings ? 'max_lease' THEN (settings ->> 'max_lease')::interval
                            ELSE qs.max_lease END,
           dead_letter = CASE WHEN settings ? 'dead_letter' THEN v_dead ELSE qs.dead_letter END,
           expire_after = CASE WHEN settings ? 'expire_after' THEN (settings ->> 'expire_after')::interval
                               ELSE qs.expire_after END,
           strict_order = CASE WHEN settings ? 'strict_order'
                               THEN coalesce((settings ->> 'strict_order')::boolean, false) ELSE qs.strict_order END,
           priority_aging = CASE WHEN settings ? 'priority_aging' THEN (settings ->> 'priority_aging')::interval
                                 ELSE qs.priority_aging END,
           updated_at = now()
     WHERE qs.name = queue_set.queue;
    PERFORM pgjobq.notify(ARRAY[queue]);
END
$$;

-- queue_list(): every queue that has jobs or settings, with its settings and its live jobs: queued
-- and due, scheduled (queued, not yet due), running (lease valid) and expired (running, lease past).
-- max_lease is the one that applies: the queue's, or the default; dead_letter, where the jobs that fail
-- for good go (NULL: nowhere); expire_after, the expiry its jobs get by default (NULL: none);
-- strict_order, and blocked_keys: how many of its keys a failed job blocks (sequence_blocks);
-- priority_aging, how long a job waits at a priority before it is raised one step (NULL: off).
CREATE OR REPLACE FUNCTION pgjobq.queue_list()
RETURNS TABLE (queue text, paused_at timestamptz, pause_reason text, concurrency integer, key_concurrency integer,
               rate_limit integer, rate_period interval, queued bigint, scheduled bigint, running bigint,
               expired bigint, max_lease interval, dead_letter text, expire_after interval, strict_order boolean,
               blocked_keys bigint, priority_aging interval)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH counts AS (
        SELECT j.queue::text AS queue,
               count(*) FILTER (WHERE j.state = 'queued' AND j.run_at <= now()) AS queued,
               count(*) FILTER (WHERE j.state = 'queued' AND j.run_at > now()) AS scheduled,
               count(*) FILTER (WHERE j.state = 'running' AND j.lease_until > now()) AS running,
               count(*) FILTER (WHERE j.state = 'running' AND j.lease_until <= now()) AS expired
          FROM pgjobq.jobs j GROUP BY 1)
    SELECT coalesce(s.name::text, c.queue), s.paused_at, s.pause_reason, s.concurrency, s.key_concurrency,
           s.rate_limit,
           s.rate_period, coalesce(c.queued, 0), coalesce(c.scheduled, 0), coalesce(c.running, 0),
           coalesce(c.expired, 0), coalesce(s.max_lease, pgjobq.max_lease_default()), s.dead_letter::text,
           s.expire_after, coalesce(s.strict_order, false), coalesce(b.n, 0), s.priority_aging
      FROM pgjobq.queues s FULL JOIN counts c ON c.queue = s.name::text
      LEFT JOIN (SELECT x.queue::text AS queue, count(*) AS n FROM pgjobq.sequence_blocks x GROUP BY 1) b
        ON b.queue = coalesce(s.name::text, c.queue)
     ORDER BY 1
$$;
