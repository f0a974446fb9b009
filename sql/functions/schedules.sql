-- pgjobq functions: cron schedules (pgjobq.schedules): the calendar, one implementation, in the
-- database and on its clock, and the tick that enqueues their jobs.
--
-- Applied by `pgjobq migrate` with the other files of sql/functions (docs/hacking.md): each function
-- is defined once, here, as it is now.
--
-- Schedules are jobs enqueued by the calendar, without a leader.  Every worker process ticks
-- (pgjobq.schedule_tick, on its maintenance connection, about once a second).  A tick locks the due
-- schedules it can (FOR UPDATE SKIP LOCKED), enqueues their jobs and moves next_run past now() in the
-- same transaction: a schedule another tick holds is skipped, and one that a tick committed meanwhile
-- is no longer due when re-checked under its lock, so each fire time enqueues exactly once however
-- many workers tick.  Times are the database's.

-- cron_field(spec, lo, hi, names, what): the values a cron field allows, sorted.  A field is a
-- comma-separated list of *, N, N-M, each optionally /STEP (N/STEP means N-hi/STEP); names (jan..dec,
-- sun..sat) stand for their numbers when given.
CREATE OR REPLACE FUNCTION pgjobq.cron_field(spec text, lo integer, hi integer, names text[], what text) RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    part   text;
    range  text;
    a      integer;
    b      integer;
    step   integer;
    v      integer;
    vals   integer[] := '{}';
    bounds text[];
BEGIN
    IF spec IS NULL OR spec = '' THEN
        RAISE EXCEPTION 'pgjobq.cron: the % field is empty', what USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOREACH part IN ARRAY string_to_array(lower(spec), ',') LOOP
        step := 1;
        range := part;
        IF position('/' IN part) > 0 THEN
            IF split_part(part, '/', 2) !~ '^[0-9]{1,4}$' OR split_part(part, '/', 2)::integer < 1 THEN
                RAISE EXCEPTION 'pgjobq.cron: bad step in the % field "%"', what, spec
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            step := split_part(part, '/', 2)::integer;
            range := split_part(part, '/', 1);
        END IF;
        IF range IN ('*', '?') THEN
            a := lo;
            b := hi;
        ELSE
            bounds := string_to_array(range, '-');
            IF cardinality(bounds) > 2 THEN
                RAISE EXCEPTION 'pgjobq.cron: bad range in the % field "%"', what, spec
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            FOR i IN 1 .. cardinality(bounds) LOOP
                IF bounds[i] ~ '^[0-9]{1,4}$' THEN
                    v := bounds[i]::integer;
                ELSIF names IS NOT NULL AND array_position(names, bounds[i]) IS NOT NULL THEN
                    v := lo + array_position(names, bounds[i]) - 1;
                ELSE
                    RAISE EXCEPTION 'pgjobq.cron: "%" is not a value of the % field', bounds[i], what
                        USING ERRCODE = 'invalid_parameter_value';
                END IF;
                IF i = 1 THEN a := v; ELSE b := v; END IF;
            END LOOP;
            IF cardinality(bounds) = 1 THEN
                b := CASE WHEN position('/' IN part) > 0 THEN hi ELSE a END;
            END IF;
        END IF;
        IF a < lo OR b > hi OR a > b THEN
            RAISE EXCEPTION 'pgjobq.cron: the % field "%" is outside %..%', what, spec, lo, hi
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v := a;
        WHILE v <= b LOOP
            vals := vals || v;
            v := v + step;
        END LOOP;
    END LOOP;
    RETURN ARRAY(SELECT DISTINCT x FROM unnest(vals) x ORDER BY x);
END
$$;

-- cron_instant(local, tz): the instant a cron schedule fires for a local time: the local time's first
-- occurrence when clocks fall back and it happens twice; the first instant after the gap when clocks
-- spring forward and it does not exist.
CREATE OR REPLACE FUNCTION pgjobq.cron_instant(local timestamp, tz text) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    u      timestamptz := local AT TIME ZONE tz;
    e      timestamptz;
    lo_s   bigint;
    hi_s   bigint;
    mid_s  bigint;
BEGIN
    IF (u AT TIME ZONE tz) <> local THEN
        -- In a gap: the first second whose local time is past it.  Local time is monotonic within a
        -- day of the gap, so a binary search over that day finds the transition.
        lo_s := extract(epoch FROM u - interval '1 day')::bigint;
        hi_s := extract(epoch FROM u + interval '1 day')::bigint;
        WHILE hi_s - lo_s > 1 LOOP
            mid_s := (lo_s + hi_s) / 2;
            IF (to_timestamp(mid_s) AT TIME ZONE tz) > local THEN
                hi_s := mid_s;
            ELSE
                lo_s := mid_s;
            END IF;
        END LOOP;
        RETURN to_timestamp(hi_s);
    END IF;
    -- Twice?  The same local time with the offset of a day earlier is the first occurrence.
    e := (local - ((u - interval '1 day') AT TIME ZONE tz - (u - interval '1 day') AT TIME ZONE 'UTC'))
         AT TIME ZONE 'UTC';
    IF e < u AND (e AT TIME ZONE tz) = local THEN
        RETURN e;
    END IF;
    RETURN u;
END
$$;

-- cron_next(schedule, tz, after): the first instant after `after` at which the schedule fires.  A
-- schedule has 5 fields (minute hour day-of-month month day-of-week) or 6 (second first); day of
-- week 0-7 (0 and 7 are Sunday) or sun..sat, month 1-12 or jan..dec.  When both day fields are
-- restricted a day matches either (as in cron).  The usual macros stand for their expressions:
-- @yearly (@annually) 0 0 1 1 *, @monthly 0 0 1 * *, @weekly 0 0 * * 0, @daily (@midnight) 0 0 * * *,
-- @hourly 0 * * * *.  tz is an IANA time zone name (UTC by default); a bare offset ("+14",
-- "-03:00", "UTC+3") is refused, because PostgreSQL reads it with the POSIX sign (west positive),
-- the opposite of what it seems to say.
-- Daylight saving: a local time that does not exist fires at the first instant after the gap (a
-- schedule firing within the gap fires once there); a local time that occurs twice fires once, at
-- its first occurrence.  NULL when it never fires within five years (30 February).
CREATE OR REPLACE FUNCTION pgjobq.cron_next(schedule text, tz text DEFAULT 'UTC', after timestamptz DEFAULT now())
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    f       text[] := regexp_split_to_array(
                          CASE lower(btrim(coalesce(schedule, '')))
                              WHEN '@yearly' THEN '0 0 1 1 *' WHEN '@annually' THEN '0 0 1 1 *'
                              WHEN '@monthly' THEN '0 0 1 * *' WHEN '@weekly' THEN '0 0 * * 0'
                              WHEN '@daily' THEN '0 0 * * *' WHEN '@midnight' THEN '0 0 * * *'
                              WHEN '@hourly' THEN '0 * * * *'
                              ELSE btrim(coalesce(schedule, '')) END, '[[:space:]]+');
    o       integer;
    secs    integer[];
    mins    integer[];
    hours   integer[];
    doms    integer[];
    months  integer[];
    dows    integer[];
    dom_any boolean;
    dow_any boolean;
    l       timestamp;
    day     date;
    d       date;
    first   boolean;
    h       integer;
    m       integer;
    sec     integer;
    dom_ok  boolean;
    dow_ok  boolean;
    cand    timestamp;
    inst    timestamptz;
BEGIN
    IF cardinality(f) NOT IN (5, 6) THEN
        RAISE EXCEPTION 'pgjobq.cron: "%" has % fields; a schedule has 5 (minute hour day month weekday) or 6 (second first), or is one of @yearly, @monthly, @weekly, @daily, @hourly',
            schedule, cardinality(f) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF tz IS NULL OR after IS NULL THEN
        RAISE EXCEPTION 'pgjobq.cron: tz and after are required' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF tz ~ '^[[:space:]]*([+-]|[0-9]|(UTC|GMT|Z)[[:space:]]*[+-])' AND upper(btrim(tz)) NOT IN ('UTC', 'GMT', 'Z') THEN
        RAISE EXCEPTION 'pgjobq.cron: time zone "%" is an offset, which PostgreSQL reads with the POSIX sign (west of Greenwich positive); give an IANA name (Europe/Berlin, Asia/Tokyo, or Etc/GMT-3 for UTC+3) or UTC', tz
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    o := cardinality(f) - 5;
    secs := CASE WHEN o = 1 THEN pgjobq.cron_field(f[1], 0, 59, NULL, 'second') ELSE '{0}' END;
    mins := pgjobq.cron_field(f[o + 1], 0, 59, NULL, 'minute');
    hours := pgjobq.cron_field(f[o + 2], 0, 23, NULL, 'hour');
    doms := pgjobq.cron_field(f[o + 3], 1, 31, NULL, 'day of month');
    months := pgjobq.cron_field(f[o + 4], 1, 12,
                                '{jan,feb,mar,apr,may,jun,jul,aug,sep,oct,nov,dec}', 'month');
    dows := pgjobq.cron_field(f[o + 5], 0, 7, '{sun,mon,tue,wed,thu,fri,sat}', 'day of week');
    IF 7 = ANY (dows) THEN
        dows := ARRAY(SELECT DISTINCT x FROM unnest(dows || 0) x WHERE x < 7 ORDER BY x);
    END IF;
    dom_any := f[o + 3] IN ('*', '?');
    dow_any := f[o + 5] IN ('*', '?');

    l := after AT TIME ZONE tz; -- raises for an unknown time zone
    day := l::date;
    FOR i IN 0 .. 366 * 5 LOOP
        d := day + i;
        CONTINUE WHEN NOT (extract(month FROM d)::integer = ANY (months));
        dom_ok := extract(day FROM d)::integer = ANY (doms);
        dow_ok := extract(dow FROM d)::integer = ANY (dows);
        CONTINUE WHEN NOT CASE WHEN dom_any AND dow_any THEN true
                               WHEN dom_any THEN dow_ok
                               WHEN dow_any THEN dom_ok
                               ELSE dom_ok OR dow_ok END;
        first := i = 0;
        FOREACH h IN ARRAY hours LOOP
            CONTINUE WHEN first AND h < extract(hour FROM l);
            FOREACH m IN ARRAY mins LOOP
                CONTINUE WHEN first AND h = extract(hour FROM l) AND m < extract(minute FROM l);
                FOREACH sec IN ARRAY secs LOOP
                    cand := d + make_interval(hours => h, mins => m, secs => sec);
                    CONTINUE WHEN cand <= l;
                    inst := pgjobq.cron_instant(cand, tz);
                    IF inst > after THEN
                        RETURN inst;
                    END IF;
                END LOOP;
            END LOOP;
        END LOOP;
    END LOOP;
    RETURN NULL;
END
$$;

-- schedule_set(name, cron, tz, queue, kind, payload, priority, max_attempts, catch_up): creates or
-- replaces a schedule (enabled); its next run is the first fire time after now.  The expression and
-- the time zone are checked here (SQLSTATE 22023); so is that it fires at all (not 0 0 31 2 *).
CREATE OR REPLACE FUNCTION pgjobq.schedule_set(
    name         text,
    cron         text,
    tz           text     DEFAULT 'UTC',
    queue        text     DEFAULT 'default',
    kind         text     DEFAULT 'default',
    payload      jsonb    DEFAULT '{}',
    priority     smallint DEFAULT 0,
    max_attempts integer  DEFAULT 25,
    catch_up     text     DEFAULT 'latest')
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_next timestamptz := pgjobq.cron_next(cron, tz, now());
BEGIN
    IF v_next IS NULL THEN
        RAISE EXCEPTION 'pgjobq.schedule_set: schedule % ("%") never fires (no such day in the next five years)', name, cron
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO pgjobq.schedules AS s (name, cron, tz, queue, kind, payload, priority, max_attempts, catch_up,
                                       next_run)
    VALUES (schedule_set.name, btrim(schedule_set.cron), schedule_set.tz, coalesce(schedule_set.queue, 'default'),
            coalesce(schedule_set.kind, 'default'), coalesce(schedule_set.payload, '{}'),
            coalesce(schedule_set.priority, 0), coalesce(schedule_set.max_attempts, 25),
            coalesce(schedule_set.catch_up, 'latest'), v_next)
    ON CONFLICT ON CONSTRAINT schedules_pkey DO UPDATE
       SET cron = excluded.cron, tz = excluded.tz, queue = excluded.queue, kind = excluded.kind,
           payload = excluded.payload, priority = excluded.priority, max_attempts = excluded.max_attempts,
           catch_up = excluded.catch_up, next_run = excluded.next_run, enabled = true, updated_at = now();
    RETURN v_next;
END
$$;

-- schedule_enable(name, enabled): pauses (false) or resumes (true) a schedule; resuming starts from
-- the next fire time after now (what was missed while disabled is not caught up).  False when there
-- is no such schedule.
CREATE OR REPLACE FUNCTION pgjobq.schedule_enable(name text, enabled boolean) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE pgjobq.schedules s
       SET enabled = schedule_enable.enabled, updated_at = now(),
           next_run = CASE WHEN schedule_enable.enabled AND NOT s.enabled THEN pgjobq.cron_next(s.cron, s.tz, now())
                           ELSE s.next_run END
     WHERE s.name = schedule_enable.name;
    RETURN FOUND;
END
$$;

-- schedule_delete(name): false when there was no such schedule.  Jobs it enqueued stay.
CREATE OR REPLACE FUNCTION pgjobq.schedule_delete(name text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM pgjobq.schedules s WHERE s.name = schedule_delete.name;
    RETURN FOUND;
END
$$;

-- schedule_trigger(name): enqueues the schedule's job now, outside its calendar (next_run is left
-- alone).  Returns the job's id, or NULL when there is no such schedule.
CREATE OR REPLACE FUNCTION pgjobq.schedule_trigger(name text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s    pgjobq.schedules%ROWTYPE;
    v_id bigint;
BEGIN
    SELECT * INTO s FROM pgjobq.schedules sc WHERE sc.name = schedule_trigger.name;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT e.id INTO v_id
      FROM pgjobq.enqueue_many(ARRAY[s.queue::text], ARRAY[s.kind::text], ARRAY[s.payload::jsonb],
                               ARRAY[s.priority], NULL, NULL, ARRAY[s.max_attempts], NULL) e;
    RETURN v_id;
END
$$;

-- schedule_sync(schedules): makes the set of schedules exactly the given JSON array of objects
-- ({"name", "schedule", and optionally "tz", "queue", "kind", "payload", "priority", "max_attempts",
-- "catch_up"}): schedules missing from it are deleted, changed ones replaced, unchanged ones left as
-- they are (their next run included).  All or nothing.  Returns how many schedules it created,
-- changed or deleted.
CREATE OR REPLACE FUNCTION pgjobq.schedule_sync(schedules jsonb) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    e       jsonb;
    k       text;
    n       integer := 0;
    v_names text[] := '{}';
    v_old   pgjobq.schedules%ROWTYPE;
    v_name  text;
    v_gone  integer;
BEGIN
    IF schedules IS NULL OR jsonb_typeof(schedules) <> 'array' THEN
        RAISE EXCEPTION 'pgjobq.schedule_sync: schedules must be a JSON array of objects'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR e IN SELECT x FROM jsonb_array_elements(schedules) x LOOP
        IF jsonb_typeof(e) <> 'object' OR NOT (e ? 'name') OR NOT (e ? 'schedule') THEN
            RAISE EXCEPTION 'pgjobq.schedule_sync: each schedule is an object with "name" and "schedule": %', left(e::text, 200)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        FOR k IN SELECT jsonb_object_keys(e) LOOP
            IF k NOT IN ('name', 'schedule', 'tz', 'queue', 'kind', 'payload', 'priority', 'max_attempts', 'catch_up') THEN
                RAISE EXCEPTION 'pgjobq.schedule_sync: schedule %: unknown field "%"', e ->> 'name', k
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
        END LOOP;
        v_name := e ->> 'name';
        IF v_name = ANY (v_names) THEN
            RAISE EXCEPTION 'pgjobq.schedule_sync: schedule % is given twice', v_name
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_names := v_names || v_name;
        SELECT * INTO v_old FROM pgjobq.schedules sc WHERE sc.name = v_name;
        IF FOUND AND v_old.cron = btrim(e ->> 'schedule') AND v_old.tz = coalesce(e ->> 'tz', 'UTC')
           AND v_old.queue = coalesce(e ->> 'queue', 'default') AND v_old.kind = coalesce(e ->> 'kind', 'default')
           AND v_old.payload::jsonb = coalesce(e -> 'payload', '{}') AND v_old.priority = coalesce((e ->> 'priority')::smallint, 0)
           AND v_old.max_attempts = coalesce((e ->> 'max_attempts')::integer, 25)
           AND v_old.catch_up = coalesce(e ->> 'catch_up', 'latest') AND v_old.enabled THEN
            CONTINUE;
        END IF;
        PERFORM pgjobq.schedule_set(v_name, e ->> 'schedule', coalesce(e ->> 'tz', 'UTC'),
                                    coalesce(e ->> 'queue', 'default'), coalesce(e ->> 'kind', 'default'),
                                    coalesce(e -> 'payload', '{}'), coalesce((e ->> 'priority')::smallint, 0::smallint),
                                    coalesce((e ->> 'max_attempts')::integer, 25), coalesce(e ->> 'catch_up', 'latest'));
        n := n + 1;
    END LOOP;
    DELETE FROM pgjobq.schedules sc WHERE sc.name::text <> ALL (v_names);
    GET DIAGNOSTICS v_gone = ROW_COUNT;
    RETURN n + v_gone;
END
$$;

-- schedule_list(): every schedule, by name.
CREATE OR REPLACE FUNCTION pgjobq.schedule_list() RETURNS SETOF pgjobq.schedules
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM pgjobq.schedules ORDER BY name
$$;

-- schedule_tick(max_schedules): enqueues the jobs of the schedules that are due, at most
-- max_schedules of them, and returns how many jobs it enqueued.  Fire times missed while no worker
-- ticked follow the schedule's catch_up: 'latest' enqueues one job for the most recent; 'all' one per
-- fire time, at most 100 (the most recent); 'skip' only a fire time less than a minute late.
CREATE OR REPLACE FUNCTION pgjobq.schedule_tick(max_schedules integer DEFAULT 100) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s      pgjobq.schedules%ROWTYPE;
    v_at   timestamptz;
    v_due  timestamptz[];
    v_n    integer;
    v_jobs integer := 0;
BEGIN
    FOR s IN SELECT * FROM pgjobq.schedules sc
              WHERE sc.enabled AND sc.next_run <= now()
              ORDER BY sc.next_run LIMIT max_schedules
                FOR UPDATE SKIP LOCKED LOOP
        -- The fire times due now, oldest first; the 101st and older are not needed by any policy.
        v_due := ARRAY[s.next_run];
        v_at := s.next_run;
        LOOP
            v_at := pgjobq.cron_next(s.cron, s.tz, v_at);
            EXIT WHEN v_at IS NULL OR v_at > now();
            v_due := v_due || v_at;
            IF cardinality(v_due) > 100 THEN
                v_due := v_due[2:];
            END IF;
        END LOOP;
        v_due := CASE s.catch_up
                     WHEN 'all' THEN v_due
                     WHEN 'latest' THEN v_due[cardinality(v_due):]
                     ELSE (SELECT coalesce(array_agg(t), '{}') FROM unnest(v_due[cardinality(v_due):]) t
                            WHERE t > now() - interval '1 minute') END;
        v_n := cardinality(v_due);
        IF v_n > 0 THEN
            PERFORM pgjobq.enqueue_many(array_fill(s.queue::text, ARRAY[v_n]), array_fill(s.kind::text, ARRAY[v_n]),
                                        array_fill(s.payload::jsonb, ARRAY[v_n]), array_fill(s.priority, ARRAY[v_n]),
                                        NULL, NULL, array_fill(s.max_attempts, ARRAY[v_n]), NULL);
            v_jobs := v_jobs + v_n;
        END IF;
        UPDATE pgjobq.schedules sc
           SET next_run = pgjobq.cron_next(s.cron, s.tz, now()),
               last_run = CASE WHEN v_n > 0 THEN v_due[v_n] ELSE sc.last_run END
         WHERE sc.name = s.name;
    END LOOP;
    RETURN v_jobs;
END
$$;
