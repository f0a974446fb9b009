-- pgjobq functions: durable execution (docs/durable.md): a job's steps, stored once and read by its
-- later attempts; durable sleeps and waits for events, which park the job (queued, its attempt given
-- back, no lease) until their time or their event; and the events.
--
-- Applied by `pgjobq migrate` with the other files of sql/functions (docs/hacking.md): each function
-- is defined once, here, as it is now.
--
-- Fencing.  Every write of a holder here names the job's lease token, as complete_many does, and is
-- accepted only while the job runs under that token with a lease that has not expired.  The lease is
-- compared with clock_timestamp(), not now(): step_put is meant to run at the end of a transaction
-- of the holder's that carries the step's own effects, and that transaction's now() is when it
-- began, maybe long before.  step_put locks the job's row (FOR KEY SHARE) until that transaction
-- ends: the rescue (FOR UPDATE SKIP LOCKED), a completion or failure (which move or lock the row) and
-- an operator's retry_running wait for it, so a step stored under a valid lease is committed before
-- anyone else can hold the job, and a holder whose lease was taken over stores nothing ('lost': its
-- transaction is rolled back, effects and all).  The heartbeat (an UPDATE that keys nothing) does
-- not wait for it.
--
-- Parking.  sleep and wait_event record their step and, while it is not over, hand the job back as
-- a snooze does (queued, attempt - 1, no lease) but due at the sleep's end or the wait's timeout,
-- without counting a snooze, and note the park in pgjobq.job_parks under the token of the attempt
-- that parked (the job's current park while it is queued under that token: the claim that resumes
-- it draws a new one).  A job whose cancellation was requested ends cancelled instead.
--
-- Events.  send_event(name, key, payload) stores the event (kept event_retention(), 7 days) and, in
-- the sender's transaction, resumes every job parked waiting for its (name, key): the event is
-- stored as the wait's step of each (so its replay is deterministic) and the job is due at once.  A
-- wait that begins later takes the first event of its (name, key) still kept: an event sent before
-- the wait began is not lost.  Both sides take a transaction-scoped advisory lock on the (name, key)
-- before they look at the other's rows, so that a wait and a send that run together cannot miss
-- each other (a send waits for a wait's park to commit, and a wait for a send's event).

-- event_retention(): how long an event is kept for the waits that begin after it was sent (prune
-- removes older ones): 7 days.
CREATE OR REPLACE FUNCTION pgjobq.event_retention() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT interval '7 days' $$;

-- step_name_why(name, what): why a step's (or an event's) name is refused, NULL when it is fine:
-- 1 to 255 characters.
CREATE OR REPLACE FUNCTION pgjobq.step_name_why(name text, what text) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN name IS NULL THEN format('%s must be given', what)
                WHEN length(name) NOT BETWEEN 1 AND 255
                THEN format('%s must be 1 to 255 characters, not %s', what, length(name)) END
$$;

-- step_get(id, token, name): the step `name` of the job its caller holds: ('stored', its result,
-- when it was stored), ('none', NULL, NULL) when it was never stored, or ('lost', ...) when the
-- job does not run under that token any more (ended, expired, taken over).
-- (PL/pgSQL, not SQL: a SQL function that cannot be inlined, as a SECURITY DEFINER one, plans its
-- query at every call; PL/pgSQL keeps the plan for the session.)
CREATE OR REPLACE FUNCTION pgjobq.step_get(id bigint, token bigint, name text)
RETURNS TABLE (outcome text, result jsonb, stored_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    SELECT CASE WHEN j.id IS NULL THEN 'lost' WHEN s.job_id IS NULL THEN 'none' ELSE 'stored' END,
           s.result, s.stored_at
      FROM (SELECT) one
      LEFT JOIN pgjobq.jobs j
        ON j.id = step_get.id AND j.lease_token = step_get.token AND j.lease_until > clock_timestamp()
      LEFT JOIN pgjobq.job_steps s ON j.id IS NOT NULL AND s.job_id = step_get.id AND s.name = step_get.name;
END
$$;

-- steps_of(id, token): every stored step of the job its caller holds, at once: a row (true, name,
-- result) each, or one row (true, NULL, NULL) when it has none; one row (false, NULL, NULL) when the
-- job does not run under that token any more.  A handler reads them at its first step and runs, and
-- stores, each step not among them without a read of its own (step_put still refuses a store under
-- a lost lease).
CREATE OR REPLACE FUNCTION pgjobq.steps_of(id bigint, token bigint)
RETURNS TABLE (held boolean, name text, result jsonb)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM pgjobq.jobs j
                    WHERE j.id = steps_of.id AND j.lease_token = steps_of.token AND j.lease_until > clock_timestamp()) THEN
        RETURN QUERY SELECT false, NULL::text, NULL::jsonb;
        RETURN;
    END IF;
    RETURN QUERY SELECT true, s.name, s.result FROM pgjobq.job_steps s WHERE s.job_id = steps_of.id;
    IF NOT FOUND THEN
        RETURN QUERY SELECT true, NULL::text, NULL::jsonb;
    END IF;
END
$$;

-- step_put(id, token, name, value): stores the result of the job's step `name` (any JSON, NULL
-- stored as JSON null, at most 1 MiB as text), fenced by the lease (see the top of this file), in the
-- caller's transaction.  Returns ('stored', value), ('exists', the result stored before: a step of
-- that name was stored already, which stands) or ('lost', NULL): nothing stored, and the caller must
-- roll back what its transaction did for the step.
CREATE OR REPLACE FUNCTION pgjobq.step_put(id bigint, token bigint, name text, value jsonb)
RETURNS TABLE (outcome text, result jsonb)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_attempt integer;
    v_why     text := pgjobq.step_name_why(step_put.name, 'a step''s name');
BEGIN
    IF v_why IS NOT NULL THEN
        RAISE EXCEPTION 'pgjobq.step_put: %', v_why USING ERRCODE = 'invalid_parameter_value';
    END IF;
    value := coalesce(value, 'null'::jsonb);
    IF octet_length(value::text) > 1048576 THEN
        RAISE EXCEPTION 'pgjobq.step_put: the result of step "%" is % bytes of JSON; at most 1048576',
            step_put.name, octet_length(value::text) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A transaction that has written nothing else (a step whose effects are elsewhere, stored on its
    -- own) commits without waiting for the WAL's flush: its record is durable with the job's next
    -- flushed write (a step with effects in the database, its completion), and lost only to a crash
    -- or failover of the server within that moment, when the step runs again (at least once, as such
    -- a step runs anyway: docs/guarantees.md, promise 15).  A step with effects keeps them durable at
    -- its commit.
    IF pg_current_xact_id_if_assigned() IS NULL THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    SELECT j.attempt INTO v_attempt FROM pgjobq.jobs j
     WHERE j.id = step_put.id AND j.lease_token = step_put.token AND j.lease_until > clock_timestamp()
       FOR KEY SHARE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'lost'::text, NULL::jsonb;
        RETURN;
    END IF;
    INSERT INTO pgjobq.job_steps (job_id, name, result, attempt, stored_at)
    VALUES (step_put.id, step_put.name, value, v_attempt, clock_timestamp())
    ON CONFLICT ON CONSTRAINT job_steps_pkey DO NOTHING;
    IF FOUND THEN
        RETURN QUERY SELECT 'stored'::text, value;
        RETURN;
    END IF;
    RETURN QUERY SELECT 'exists'::text, s.result FROM pgjobq.job_steps s
                  WHERE s.job_id = step_put.id AND s.name = step_put.name;
END
$$;

-- job_park(id, why, step, until, event_name, event_key): parks a job its caller holds and has locked
-- (sleep, wait_event): queued, its attempt given back, due at `until`, no lease, the park noted in
-- job_parks under the job's token (the same step's park keeps its `since`); or, when its cancellation
-- was requested, ends it cancelled.  Returns 'parked' or 'cancelled'.  For the functions of this file
-- only (no role is granted it).
CREATE OR REPLACE FUNCTION pgjobq.job_park(id bigint, why text, step text, until timestamptz, event_name text,
                                           event_key text)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_token bigint;
BEGIN
    IF (SELECT j.cancel_requested FROM pgjobq.jobs j WHERE j.id = job_park.id) THEN
        PERFORM pgjobq.history_move_cancelled(ARRAY[job_park.id], NULL);
        DELETE FROM pgjobq.job_parks p WHERE p.job_id = job_park.id;
        RETURN 'cancelled';
    END IF;
    UPDATE pgjobq.jobs j
       SET state = 'queued', attempt = j.attempt - 1, run_at = job_park.until, lease_until = NULL
     WHERE j.id = job_park.id
    RETURNING j.lease_token INTO v_token;
    INSERT INTO pgjobq.job_parks AS p (job_id, token, why, step, until, event_name, event_key, since)
    VALUES (job_park.id, v_token, job_park.why, job_park.step, job_park.until, job_park.event_name,
            job_park.event_key, now())
    ON CONFLICT ON CONSTRAINT job_parks_pkey DO UPDATE
       SET token = EXCLUDED.token, why = EXCLUDED.why, until = EXCLUDED.until, event_name = EXCLUDED.event_name,
           event_key = EXCLUDED.event_key, step = EXCLUDED.step,
           since = CASE WHEN p.step = EXCLUDED.step AND p.why = EXCLUDED.why THEN p.since ELSE EXCLUDED.since END;
    RETURN 'parked';
END
$$;

-- sleep(id, token, name, delay): the durable sleep `name` of the job its caller holds.  The first
-- time, it stores the step {"sleep_until": now + delay} and parks the job until then: ('parked',
-- until); the caller ends its attempt there (the worker writes nothing more: the lease is given
-- back).  When the attempt that resumes the job (or any later one) comes to the same sleep, the
-- stored end is passed: ('over', until), and the caller goes on; a sleep resumed early (a retry by
-- hand wakes it: admin.sql) whose end has not come parks again until it.  ('cancelled', NULL): the
-- job's cancellation was requested, it ended cancelled; ('lost', NULL): not held under that token.
-- delay: 0 to 100 years.  Fenced like step_put.
CREATE OR REPLACE FUNCTION pgjobq.sleep(id bigint, token bigint, name text, delay interval)
RETURNS TABLE (outcome text, until timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_attempt integer;
    v_result  jsonb;
    v_until   timestamptz;
    v_why     text := pgjobq.step_name_why(sleep.name, 'a sleep''s name');
BEGIN
    IF v_why IS NOT NULL THEN
        RAISE EXCEPTION 'pgjobq.sleep: %', v_why USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF delay IS NULL OR delay < interval '0' OR delay > interval '3155760000 seconds' THEN
        RAISE EXCEPTION 'pgjobq.sleep: a sleep''s delay must be from 0 to 100 years, not %', coalesce(delay::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT j.attempt INTO v_attempt FROM pgjobq.jobs j
     WHERE j.id = sleep.id AND j.lease_token = sleep.token AND j.lease_until > clock_timestamp()
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'lost'::text, NULL::timestamptz;
        RETURN;
    END IF;
    SELECT s.result INTO v_result FROM pgjobq.job_steps s WHERE s.job_id = sleep.id AND s.name = sleep.name;
    IF FOUND THEN
        IF jsonb_typeof(v_result -> 'sleep_until') IS DISTINCT FROM 'string' THEN
            RAISE EXCEPTION 'pgjobq.sleep: the step "%" of job % is not a sleep', sleep.name, sleep.id
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_until := (v_result ->> 'sleep_until')::timestamptz;
    ELSE
        v_until := clock_timestamp() + delay;
        INSERT INTO pgjobq.job_steps (job_id, name, result, attempt, stored_at)
        VALUES (sleep.id, sleep.name, jsonb_build_object('sleep_until', v_until), v_attempt, clock_timestamp());
    END IF;
    IF v_until <= clock_timestamp() THEN
        DELETE FROM pgjobq.job_parks p WHERE p.job_id = sleep.id AND p.step = sleep.name;
        RETURN QUERY SELECT 'over'::text, v_until;
        RETURN;
    END IF;
    RETURN QUERY SELECT pgjobq.job_park(sleep.id, 'sleep', sleep.name, v_until, NULL, NULL),
                        v_until;
END
$$;

-- event_lock(name, key): the transaction-scoped advisory lock that orders the waits and the sends of
-- one (name, key) (see the top of this file).  For the functions of this file only.
CREATE OR REPLACE FUNCTION pgjobq.event_lock(name text, key text) RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_advisory_xact_lock(hashtext('pgjobq.event:' || name), hashtext(key))
$$;

-- wait_event(id, token, name, event_name, event_key, timeout): the wait `name` of the job its caller
-- holds, for the event (event_name, event_key).  Returns
--   ('event', payload, sent_at, NULL)  the first event of that (name, key) still kept, or the one
--                                      that resumed the job, stored as the step `name`;
--   ('timeout', NULL, NULL, until)     no event came before the timeout, which counts from the wait's
--                                      first call (NULL: 100 years); stored as the step {"timeout": true};
--   ('parked', NULL, NULL, until)      neither yet: the job is parked until the timeout or the event
--                                      (send_event), and the caller ends its attempt there;
--   ('cancelled', ...), ('lost', ...)  as sleep's.
-- A later attempt that comes to the same wait gets the stored answer.  Fenced like step_put.
CREATE OR REPLACE FUNCTION pgjobq.wait_event(id bigint, token bigint, name text, event_name text,
                                             event_key text DEFAULT '', timeout interval DEFAULT NULL)
RETURNS TABLE (outcome text, payload jsonb, sent_at timestamptz, until timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_attempt integer;
    v_result  jsonb;
    v_payload jsonb;
    v_sent    timestamptz;
    v_until   timestamptz;
    v_why     text := coalesce(pgjobq.step_name_why(wait_event.name, 'a wait''s name'),
                               pgjobq.step_name_why(wait_event.event_name, 'an event''s name'),
                               CASE WHEN length(wait_event.event_key) > 255
                                    THEN format('an event''s key must be at most 255 characters, not %s',
                                                length(wait_event.event_key)) END);
BEGIN
    IF v_why IS NOT NULL THEN
        RAISE EXCEPTION 'pgjobq.wait_event: %', v_why USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF timeout < interval '0' OR timeout > interval '3155760000 seconds' THEN
        RAISE EXCEPTION 'pgjobq.wait_event: a wait''s timeout must be from 0 to 100 years, not %', timeout
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    event_key := coalesce(event_key, '');
    -- The (name, key) first, then the job's row: the order send_event takes them in.
    PERFORM pgjobq.event_lock(wait_event.event_name, event_key);
    SELECT j.attempt INTO v_attempt FROM pgjobq.jobs j
     WHERE j.id = wait_event.id AND j.lease_token = wait_event.token AND j.lease_until > clock_timestamp()
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'lost'::text, NULL::jsonb, NULL::timestamptz, NULL::timestamptz;
        RETURN;
    END IF;
    SELECT s.result INTO v_result FROM pgjobq.job_steps s WHERE s.job_id = wait_event.id AND s.name = wait_event.name;
    IF FOUND THEN
        IF v_result ? 'timeout' THEN
            RETURN QUERY SELECT 'timeout'::text, NULL::jsonb, NULL::timestamptz, (v_result ->> 'timeout_at')::timestamptz;
        ELSIF v_result ? 'event' AND v_result ? 'sent_at' THEN
            RETURN QUERY SELECT 'event'::text, v_result -> 'event', (v_result ->> 'sent_at')::timestamptz,
                                NULL::timestamptz;
        ELSE
            RAISE EXCEPTION 'pgjobq.wait_event: the step "%" of job % is not a wait', wait_event.name, wait_event.id
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        RETURN;
    END IF;
    SELECT e.payload, e.sent_at INTO v_payload, v_sent FROM pgjobq.events e
     WHERE e.name = wait_event.event_name AND e.key = event_key
     ORDER BY e.id LIMIT 1;
    IF FOUND THEN
        INSERT INTO pgjobq.job_steps (job_id, name, result, attempt, stored_at)
        VALUES (wait_event.id, wait_event.name, jsonb_build_object('event', v_payload, 'sent_at', v_sent), v_attempt,
                clock_timestamp());
        DELETE FROM pgjobq.job_parks p WHERE p.job_id = wait_event.id;
        RETURN QUERY SELECT 'event'::text, v_payload, v_sent, NULL::timestamptz;
        RETURN;
    END IF;
    -- The timeout counts from the wait's first call: a park of this wait keeps it.
    SELECT p.until INTO v_until FROM pgjobq.job_parks p
     WHERE p.job_id = wait_event.id AND p.why = 'event' AND p.step = wait_event.name;
    IF NOT FOUND THEN
        v_until := clock_timestamp() + coalesce(timeout, interval '3155760000 seconds');
    END IF;
    IF v_until <= clock_timestamp() THEN
        INSERT INTO pgjobq.job_steps (job_id, name, result, attempt, stored_at)
        VALUES (wait_event.id, wait_event.name, jsonb_build_object('timeout', true, 'timeout_at', v_until), v_attempt,
                clock_timestamp());
        DELETE FROM pgjobq.job_parks p WHERE p.job_id = wait_event.id;
        RETURN QUERY SELECT 'timeout'::text, NULL::jsonb, NULL::timestamptz, v_until;
        RETURN;
    END IF;
    RETURN QUERY SELECT pgjobq.job_park(wait_event.id, 'event', wait_event.name, v_until, wait_event.event_name,
                                        event_key),
                        NULL::jsonb, NULL::timestamptz, v_until;
END
$$;

-- send_event(name, key, payload): sends an event, in the caller's transaction (it exists, and the
-- jobs it resumes are resumed, if and only if that commits).  The event is kept event_retention()
-- for the waits that begin later; every job parked waiting for (name, key) now gets it stored as
-- its wait's step and is due at once.  Returns the event's id and how many jobs it resumed.
CREATE OR REPLACE FUNCTION pgjobq.send_event(name text, key text DEFAULT '', payload jsonb DEFAULT NULL)
RETURNS TABLE (id bigint, resumed integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_id     bigint;
    v_sent   timestamptz;
    v_n      integer;
    v_queues text[];
    v_why    text := coalesce(pgjobq.step_name_why(send_event.name, 'an event''s name'),
                              CASE WHEN length(send_event.key) > 255
                                   THEN format('an event''s key must be at most 255 characters, not %s',
                                               length(send_event.key)) END);
BEGIN
    IF v_why IS NOT NULL THEN
        RAISE EXCEPTION 'pgjobq.send_event: %', v_why USING ERRCODE = 'invalid_parameter_value';
    END IF;
    key := coalesce(key, '');
    payload := coalesce(payload, 'null'::jsonb);
    IF octet_length(payload::text) > 1048576 THEN
        RAISE EXCEPTION 'pgjobq.send_event: the payload is % bytes of JSON; at most 1048576', octet_length(payload::text)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pgjobq.event_lock(send_event.name, key);
    INSERT INTO pgjobq.events AS e (name, key, payload) VALUES (send_event.name, key, payload)
    RETURNING e.id, e.sent_at INTO v_id, v_sent;
    -- The jobs parked on this (name, key) now (a park is current while its job is queued under the
    -- token that parked it), locked; due at once, and claimable from now on (ready_at after this
    -- transaction's id, which the insert above gave it: claim.sql).
    WITH w AS MATERIALIZED (
        SELECT p.job_id, p.step, j.attempt FROM pgjobq.job_parks p JOIN pgjobq.jobs j ON j.id = p.job_id
         WHERE p.why = 'event' AND p.event_name = send_event.name AND p.event_key = key
           AND j.state = 'queued' AND j.lease_token = p.token
           FOR UPDATE OF j),
    stored AS (
        INSERT INTO pgjobq.job_steps (job_id, name, result, attempt, stored_at)
        SELECT w.job_id, w.step, jsonb_build_object('event', payload, 'sent_at', v_sent), w.attempt, clock_timestamp()
          FROM w
        ON CONFLICT ON CONSTRAINT job_steps_pkey DO NOTHING),
    unparked AS (
        DELETE FROM pgjobq.job_parks p USING w WHERE p.job_id = w.job_id),
    woken AS (
        UPDATE pgjobq.jobs j SET run_at = now(), ready_at = clock_timestamp()
          FROM w WHERE j.id = w.job_id
        RETURNING j.queue::text AS queue)
    SELECT count(*)::integer, array_agg(DISTINCT woken.queue) INTO v_n, v_queues FROM woken;
    IF v_n > 0 THEN
        PERFORM pgjobq.notify(v_queues);
    END IF;
    RETURN QUERY SELECT v_id, v_n;
END
$$;

-- steps(job_id): the job's stored steps, in the order they were stored: name, the attempt that
-- stored it, when, and the size of its result (bytes of JSON text).  For `pgjobq show`, the
-- dashboard and Python's JobInfo.steps.
CREATE OR REPLACE FUNCTION pgjobq.steps(job_id bigint)
RETURNS TABLE (name text, attempt integer, stored_at timestamptz, result_bytes integer)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
    SELECT s.name, s.attempt, s.stored_at, octet_length(s.result::text)
      FROM pgjobq.job_steps s WHERE s.job_id = steps.job_id
     ORDER BY s.stored_at, s.name
$$;

-- job_park_of(job_id): the job's current park, if any: 'sleeping' (why 'sleep') or 'waiting' for an
-- event, in which step, until when (the sleep's end, the wait's timeout), for which event, since when.
CREATE OR REPLACE FUNCTION pgjobq.job_park_of(job_id bigint)
RETURNS TABLE (parked text, step text, until timestamptz, event_name text, event_key text, since timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
    SELECT CASE p.why WHEN 'sleep' THEN 'sleeping' ELSE 'waiting' END, p.step, p.until, p.event_name, p.event_key,
           p.since
      FROM pgjobq.job_parks p JOIN pgjobq.jobs j ON j.id = p.job_id
     WHERE p.job_id = job_park_of.job_id AND j.state = 'queued' AND j.lease_token = p.token
$$;

-- monitor_parked(): per queue, how many jobs sleep and how many wait for an event now (for
-- /metrics and the dashboard).  Reads the parks, each with its job by the primary key.
CREATE OR REPLACE FUNCTION pgjobq.monitor_parked()
RETURNS TABLE (queue text, sleeping bigint, waiting bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
    SELECT j.queue::text, count(*) FILTER (WHERE p.why = 'sleep'), count(*) FILTER (WHERE p.why = 'event')
      FROM pgjobq.job_parks p JOIN pgjobq.jobs j ON j.id = p.job_id
     WHERE j.state = 'queued' AND j.lease_token = p.token
     GROUP BY 1 ORDER BY 1
$$;

-- durable_forget(ids): removes the steps and parks of jobs (retention pruned them, a reset removed
-- them, a retry by hand of a completed job starts it over).  For prune, retry and reset_queue only.
CREATE OR REPLACE FUNCTION pgjobq.durable_forget(ids bigint[]) RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    DELETE FROM pgjobq.job_steps s WHERE s.job_id = ANY (durable_forget.ids);
    DELETE FROM pgjobq.job_parks p WHERE p.job_id = ANY (durable_forget.ids);
$$;

-- parks_wake(ids): the current parks of these jobs (queued under the token that parked them) end now,
-- for a retry by hand (admin.sql): a sleep's stored end moves to now, so that its replay goes on; a
-- wait's timeout comes now (the park's, which the wait reads), so that its replay gets the timeout
-- answer unless an event is there.  The caller makes the jobs due.  For retry and retry_where only.
CREATE OR REPLACE FUNCTION pgjobq.parks_wake(ids bigint[]) RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE pgjobq.job_steps s SET result = jsonb_build_object('sleep_until', now())
      FROM pgjobq.job_parks p JOIN pgjobq.jobs j ON j.id = p.job_id AND j.lease_token = p.token
     WHERE p.job_id = ANY (parks_wake.ids) AND p.why = 'sleep' AND s.job_id = p.job_id AND s.name = p.step;
    UPDATE pgjobq.job_parks p SET until = now()
      FROM pgjobq.jobs j
     WHERE p.job_id = ANY (parks_wake.ids) AND j.id = p.job_id AND j.lease_token = p.token;
$$;
