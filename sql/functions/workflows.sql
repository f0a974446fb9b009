-- pgjobq functions: workflows: jobs that wait for other jobs (pgjobq.deps), graphs and batches
-- enqueued at once, and reading a workflow.
--
-- Applied by `pgjobq migrate` with the other files of sql/functions (docs/hacking.md): each function
-- is defined once, here, as it is now.

-- children_release(parents, ok, among): the parents have finished (ok: completed; otherwise failed
-- or cancelled).  Each child still waiting on them counts them off; a child whose count reaches 0 is
-- queued (and its queue notified).  A child of a parent that did not complete is cancelled, with the
-- parent named in last_error, unless it was enqueued with on_parent_failure 'run' (or is a batch
-- callback): then the parent counts as finished.  Cancelling a child cancels its own waiting children
-- in turn.  `among` limits the first round to those children (an enqueue whose parents had already
-- finished).  Must run in a statement that starts after the statement that finished the parents, so
-- that it sees every edge committed while that statement waited for a parent's row.  It reaches
-- pgjobq.deps through an index per parent, a nested loop: enable_nestloop is set on, as the fenced
-- writes that call it turn it off (transitions.sql).
CREATE OR REPLACE FUNCTION pgjobq.children_release(parents bigint[], ok boolean[], among bigint[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_nestloop = on
AS $$
DECLARE
    v_parents bigint[]  := parents;
    v_ok      boolean[] := ok;
    v_only    bigint[]  := among;
    v_kid     bigint[];
    v_nok     bigint[];
    v_nbad    bigint[];
    v_bad     bigint[];
    v_due     text[];
    v_next    bigint[];
BEGIN
    WHILE v_parents IS NOT NULL LOOP
        SELECT array_agg(k.child ORDER BY k.child), array_agg(k.n_ok ORDER BY k.child),
               array_agg(k.n_bad ORDER BY k.child), array_agg(k.bad ORDER BY k.child)
          INTO v_kid, v_nok, v_nbad, v_bad
          FROM (SELECT d.child, count(*) FILTER (WHERE p.ok) AS n_ok, count(*) FILTER (WHERE NOT p.ok) AS n_bad,
                       min(p.id) FILTER (WHERE NOT p.ok) AS bad
                  FROM (SELECT DISTINCT u.id, coalesce(u.ok, false) AS ok FROM unnest(v_parents, v_ok) AS u(id, ok)) p
                  JOIN pgjobq.deps d ON d.parent = p.id
                 WHERE v_only IS NULL OR d.child = ANY (v_only)
                 GROUP BY d.child) k;
        EXIT WHEN v_kid IS NULL;
        -- Lock the waiting children in id order: the completions of a fan-in queue here one after the
        -- other, and the statements below read the latest count.
        PERFORM 1 FROM pgjobq.jobs j WHERE j.id = ANY (v_kid) AND j.state = 'waiting' ORDER BY j.id FOR UPDATE;

        WITH u AS (SELECT * FROM unnest(v_kid, v_nbad, v_bad) AS u(id, n_bad, bad)),
        gone AS (
            DELETE FROM pgjobq.jobs j USING u
             WHERE j.id = ANY (v_kid) AND j.id = u.id AND j.state = 'waiting' AND u.n_bad > 0
               AND j.on_parent_failure = 'cancel'
            RETURNING j.*, u.bad),
        moved AS (
            INSERT INTO pgjobq.history (id, queue, kind, payload, priority, state, attempt, max_attempts, run_at,
                                        created_at, started_at, finished_at, lease_token, worker_id, result,
                                        last_error, unique_key, cancel_requested, tags, progress, concurrency_key,
                                        cancel_requested_at, cancel_told_at, route_key, snoozes, expires_at, base_priority, traceparent)
            SELECT g.id, g.queue, g.kind, g.payload, g.priority, 'cancelled', g.attempt, g.max_attempts, g.run_at,
                   g.created_at, g.started_at, now(), g.lease_token, g.worker_id, g.result,
                   format('parent job %s failed or was cancelled', g.bad), g.unique_key, g.cancel_requested, g.tags,
                   g.progress, g.concurrency_key, g.cancel_requested_at, g.cancel_told_at, g.route_key, g.snoozes, g.expires_at, g.base_priority, g.traceparent
              FROM gone g
            RETURNING pgjobq.history.queue),
        tallied AS (
            INSERT INTO pgjobq.tallies (queue, what, n) SELECT m.queue, 'cancelled', count(*) FROM moved m GROUP BY 1)
        SELECT array_agg(g.id) FILTER (WHERE g.has_children) INTO v_next
          FROM gone g CROSS JOIN (SELECT count(*) FROM moved) m;

        WITH u AS (SELECT u.id, u.n_ok + u.n_bad AS n FROM unnest(v_kid, v_nok, v_nbad) AS u(id, n_ok, n_bad)),
        released AS (
            UPDATE pgjobq.jobs j
               SET pending_parents = CASE WHEN j.pending_parents - u.n > 0 THEN j.pending_parents - u.n END,
                   state = CASE WHEN j.pending_parents - u.n > 0 THEN 'waiting'::pgjobq.job_state
                                ELSE 'queued'::pgjobq.job_state END,
                   payload = CASE WHEN j.on_parent_failure = 'batch' AND j.pending_parents - u.n <= 0
                                  THEN j.payload || jsonb_build_object('batch', pgjobq.batch_counts(j.id))
                                  ELSE j.payload END
              FROM u
             WHERE j.id = ANY (v_kid) AND j.id = u.id AND j.state = 'waiting'
            RETURNING j.queue::text AS queue, j.state, j.run_at)
        SELECT array_agg(DISTINCT r.queue) FILTER (WHERE r.state = 'queued' AND r.run_at <= now()) INTO v_due
          FROM released r;
        PERFORM pgjobq.notify(v_due);

        v_parents := v_next;
        v_ok := array_fill(false, ARRAY[coalesce(cardinality(v_next), 0)]);
        v_only := NULL;
    END LOOP;
END
$$;

-- batch_counts(callback): what a batch's callback job finds in its payload under "batch" when it is
-- released: how many jobs the batch had and how each ended.
CREATE OR REPLACE FUNCTION pgjobq.batch_counts(callback bigint) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
    SELECT jsonb_build_object('id', $1, 'jobs', count(*),
                              'completed', count(*) FILTER (WHERE a.state = 'completed'),
                              'failed', count(*) FILTER (WHERE a.state = 'failed'),
                              'cancelled', count(*) FILTER (WHERE a.state = 'cancelled'))
      FROM pgjobq.deps d LEFT JOIN pgjobq.all_jobs a ON a.id = d.parent
     WHERE d.child = $1
$$;

-- caller_crosses_queues(): whether the caller may make jobs of any queue parents (enqueue_graph):
-- a member of pgjobq_cross_queue (sql/roles.sql; pgjobq_admin is one), the schema's owner, a
-- superuser.  The caller is the session's role, SET ROLE included: inside pgjobq's SECURITY DEFINER
-- functions current_user is the schema's owner, and SET ROLE cannot run inside them, so the
-- setting still names the role that called.  (A SECURITY DEFINER function of your own that calls
-- pgjobq is judged by the session's role, not by its owner.)
CREATE OR REPLACE FUNCTION pgjobq.caller_crosses_queues() RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(pg_has_role(r.oid, n.nspowner, 'USAGE'), false)
           OR coalesce(pg_has_role(r.oid, x.oid, 'USAGE'), false)
      FROM pg_namespace n
      LEFT JOIN pg_roles r ON r.rolname = CASE current_setting('role') WHEN 'none' THEN session_user::text
                                                                       ELSE current_setting('role') END
      LEFT JOIN pg_roles x ON x.rolname = 'pgjobq_cross_queue'
     WHERE n.nspname = 'pgjobq'
$$;

-- enqueued_here(job, job_xmin, job_created_at): whether this transaction enqueued the job, from its
-- row's xmin and created_at (jobs or history).  Three tests, each closing a way to pass for a job of
-- another transaction:
--   created_at is this transaction's now()
--       Rows of other transactions carry their own start time; and an old row frozen by vacuum
--       keeps a raw xmin that, 2^32 transactions later, can equal one of this transaction's ids.
--   xmin is one of this transaction's ids (its own or a subtransaction's, also once released)
--       A row version this snapshot sees whose xmin is still in progress was written here:
--       another transaction's uncommitted versions are not seen.  The 32-bit xmin is widened
--       against this transaction's full id (the ids of one transaction are close together).
--       Updating a row sets its xmin too, so a job enqueued and then claimed here still passes.
--   no edge of the job has the job's xmin
--       The one write an enqueue makes to a job of another transaction is has_children, when it
--       makes the job a parent (as the rule allows: a child of the job's own queue), and
--       enqueue_graph makes it in one subtransaction with the edges, so both get its id; has_children
--       on jobs enqueued here is set outside that subtransaction.  Without this test, a parent of a
--       child of its own queue would pass, once has_children was set, for a child of any queue.
CREATE OR REPLACE FUNCTION pgjobq.enqueued_here(job bigint, job_xmin xid, job_created_at timestamptz)
RETURNS boolean
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN job_created_at IS DISTINCT FROM now() THEN false
                ELSE coalesce((SELECT pg_xact_status((t.top + (job_xmin::text::bigint - t.top % 4294967296 + 6442450944)
                                                              % 4294967296 - 2147483648)::text::xid8)
                                 FROM (SELECT pg_current_xact_id()::text::bigint AS top) t) = 'in progress', false)
                     AND NOT EXISTS (SELECT 1 FROM pgjobq.deps d WHERE d.parent = job AND d.xmin = job_xmin)
           END
$$;

-- enqueue_graph(graph): enqueues the jobs of a graph in one transaction, all or none.  graph is a
-- JSON array of jobs (or an object whose "jobs" is one).  Each job is an object with any of:
--   "ref"                a name other jobs of the graph use in "after" (default: its index, "0", "1"...)
--   "queue", "kind", "payload", "priority", "max_attempts", "concurrency_key", "route_key"
--                        as for enqueue
--   "run_at" (timestamptz text) or "delay" (seconds, a number), under enqueue_when_why's rule
--   "expires_at" (timestamptz text) or "expire_after" (seconds from its run_at, a number), under
--                        enqueue_expiry_why's rule: no attempt of the job starts after it (a waiting
--                        job expires too: docs/queues.md, "Expiry"); neither: its queue's default
--   "traceparent"        the job's W3C trace context (a string; traceparent_why's rule), handed to its
--                        handler (docs/queues.md, "Trace context")
--   "tags"               an array of 1 to 20 tags, each 1 to 64 characters
--   "after"              an array of parents: refs of jobs in the graph (strings) or ids of jobs
--                        already enqueued (numbers): of the child's queue, or enqueued by this
--                        transaction, or any job when the caller may cross queues
--   "on_parent_failure"  "cancel" (the default: a parent that fails for good or is cancelled cancels
--                        this job) or "run" (it runs once every parent has finished, however)
--   "callback"           true: a batch callback (runs once every parent has finished, however, and
--                        finds {"batch": {"id", "jobs", "completed", "failed", "cancelled"}} added
--                        to its payload)
-- A job with parents waits (state 'waiting') until they have all completed.  The graph must be
-- acyclic.  Unique keys are not accepted in a graph (enqueue_unique_key_why).  At most 10000 jobs,
-- 10000 parents per job and 100000 parents in all.  Returns one row per job, in input order: its ref
-- and its id.
-- The work is linear in the size of the graph: refs are found through a JSON object (not a join
-- whose plan could turn into a nested loop), the cycle check is Kahn's algorithm over arrays (each
-- edge is looked at once), and every per-job array read here is of a fixed-width type without NULLs,
-- where a subscript costs the same wherever it points.
CREATE OR REPLACE FUNCTION pgjobq.enqueue_graph(graph jsonb)
RETURNS TABLE (ref text, id bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_jobs    jsonb := CASE jsonb_typeof(graph) WHEN 'array' THEN graph WHEN 'object' THEN graph -> 'jobs' END;
    v_n       integer;
    v_expiry_defaults boolean := pgjobq.expiry_defaults();
    v_seq     regclass := pg_get_serial_sequence('pgjobq.jobs', 'id')::regclass;
    v_refs    text[];
    v_ids     bigint[];
    v_bad     record;
    v_refpos  jsonb;       -- {ref: position}
    v_e_child integer[];   -- edges: child's position, parent's position (in the graph) or id (outside)
    v_e_in    integer[];
    v_e_out   bigint[];
    v_e_queue text[];      -- and, for a parent outside, the child's queue
    v_g_par   integer[];   -- the edges within the graph, sorted by parent: parent's and child's position
    v_g_kid   integer[];
    v_parents integer[];   -- per job: its parents (in the graph, then also outside)
    v_kids    integer[];   -- per job: its children in the graph
    v_start   integer[];   -- per job: where its children start in v_g_kid
    v_left    integer[];   -- per job: its parents in the graph not yet taken away
    v_order   integer[];   -- the jobs taken away, in order (Kahn's queue)
    v_head    integer;
    v_tail    integer;
    v_k       integer;
    v_p       integer;
    v_c       integer;
    v_ext     bigint[];
    v_known   jsonb;       -- {id: {"queue", "here"}} of the parents outside that exist
    v_seen    bigint[];    -- those that were live when read
    v_any_here boolean;
    v_badid   bigint;
    v_live    bigint[];
    v_livemap jsonb;
    v_donemap jsonb;
    v_done    bigint[];
    v_done_ok boolean[];
    v_due     text[];
BEGIN
    IF v_jobs IS NULL OR jsonb_typeof(v_jobs) <> 'array' THEN
        RAISE EXCEPTION 'pgjobq.enqueue_graph: give an array of jobs, or an object whose "jobs" is one'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_n := jsonb_array_length(v_jobs);
    IF v_n = 0 THEN
        RETURN;
    END IF;
    IF v_n > 10000 THEN
        RAISE EXCEPTION 'pgjobq.enqueue_graph: % jobs is too many for one graph (at most 10000)', v_n
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- Each job: an object with known keys and values of the right types, that keeps the enqueue rules
    -- (enqueue.sql: enqueue_unique_key_why, enqueue_when_why).
    FOR v_bad IN
        SELECT e.o - 1 AS i, e.j,
               CASE
                 WHEN jsonb_typeof(e.j) <> 'object' THEN 'is not a JSON object'
                 WHEN e.j ? 'unique_key'
                   THEN pgjobq.enqueue_unique_key_why(coalesce(e.j ->> 'unique_key', 'null'), true)
                 WHEN EXISTS (SELECT 1 FROM jsonb_object_keys(e.j) AS k
                               WHERE k NOT IN ('ref', 'queue', 'kind', 'payload', 'priority', 'max_attempts',
                                               'concurrency_key', 'run_at', 'delay', 'tags', 'after',
                                               'on_parent_failure', 'callback', 'route_key', 'expires_at',
                                               'expire_after', 'traceparent'))
                   THEN 'has an unknown key: ' || (SELECT string_agg(k, ', ') FROM jsonb_object_keys(e.j) AS k
                               WHERE k NOT IN ('ref', 'queue', 'kind', 'payload', 'priority', 'max_attempts',
                                               'concurrency_key', 'run_at', 'delay', 'tags', 'after',
                                               'on_parent_failure', 'callback', 'route_key', 'expires_at',
                                               'expire_after', 'traceparent'))
                 WHEN e.j ? 'ref' AND (jsonb_typeof(e.j -> 'ref') <> 'string' OR length(e.j ->> 'ref') NOT BETWEEN 1 AND 255)
                   THEN '"ref" must be a string of 1 to 255 characters'
                 WHEN jsonb_typeof(e.j -> 'queue') IS DISTINCT FROM 'string' AND e.j ? 'queue'
                      OR (e.j ->> 'queue') !~ '^[A-Za-z][A-Za-z0-9_.:-]{0,63}$'
                   THEN '"queue" must be a name: a letter, then up to 63 letters, digits, _ . : -'
                 WHEN jsonb_typeof(e.j -> 'kind') IS DISTINCT FROM 'string' AND e.j ? 'kind'
                      OR (e.j ->> 'kind') !~ '^[A-Za-z][A-Za-z0-9_.:-]{0,63}$'
                   THEN '"kind" must be a name: a letter, then up to 63 letters, digits, _ . : -'
                 WHEN e.j ? 'priority' AND (jsonb_typeof(e.j -> 'priority') <> 'number'
                      OR (e.j ->> 'priority')::numeric NOT BETWEEN -100 AND 100
                      OR (e.j ->> 'priority')::numeric <> trunc((e.j ->> 'priority')::numeric))
                   THEN '"priority" must be an integer from -100 to 100'
                 WHEN e.j ? 'max_attempts' AND (jsonb_typeof(e.j -> 'max_attempts') <> 'number'
                      OR (e.j ->> 'max_attempts')::numeric NOT BETWEEN 1 AND 1000
                      OR (e.j ->> 'max_attempts')::numeric <> trunc((e.j ->> 'max_attempts')::numeric))
                   THEN '"max_attempts" must be an integer from 1 to 1000'
                 WHEN e.j ? 'concurrency_key' AND (jsonb_typeof(e.j -> 'concurrency_key') <> 'string'
                      OR length(e.j ->> 'concurrency_key') NOT BETWEEN 1 AND 255)
                   THEN '"concurrency_key" must be a string of 1 to 255 characters'
                 WHEN e.j ? 'route_key' AND (jsonb_typeof(e.j -> 'route_key') <> 'string'
                      OR length(e.j ->> 'route_key') NOT BETWEEN 1 AND 255)
                   THEN '"route_key" must be a string of 1 to 255 characters'
                 WHEN e.j ? 'delay' AND jsonb_typeof(e.j -> 'delay') <> 'number'
                   THEN '"delay" must be a number of seconds'
                 WHEN e.j ? 'run_at' AND (jsonb_typeof(e.j -> 'run_at') <> 'string' OR NOT rt.run_at_reads)
                   THEN '"run_at" must be a timestamp (text such as "2026-12-01 10:00:00+00")'
                 WHEN w.why IS NOT NULL THEN w.why
                 WHEN e.j ? 'expire_after' AND jsonb_typeof(e.j -> 'expire_after') <> 'number'
                   THEN '"expire_after" must be a number of seconds'
                 WHEN e.j ? 'expires_at' AND (jsonb_typeof(e.j -> 'expires_at') <> 'string'
                      OR NOT pgjobq.timestamp_ok(e.j ->> 'expires_at'))
                   THEN '"expires_at" must be a timestamp (text such as "2026-12-01 10:00:00+00")'
                 WHEN x.why IS NOT NULL THEN x.why
                 WHEN e.j ? 'traceparent' AND jsonb_typeof(e.j -> 'traceparent') <> 'string'
                   THEN '"traceparent" must be a string (a W3C traceparent)'
                 WHEN e.j ? 'traceparent' AND pgjobq.traceparent_why(e.j ->> 'traceparent') IS NOT NULL
                   THEN pgjobq.traceparent_why(e.j ->> 'traceparent', '"traceparent"')
                 WHEN e.j ? 'payload' AND octet_length((e.j -> 'payload')::text) > 1048576
                   THEN '"payload" is larger than 1 MiB'
                 WHEN e.j ? 'tags' AND (jsonb_typeof(e.j -> 'tags') <> 'array'
                      OR jsonb_array_length(e.j -> 'tags') NOT BETWEEN 1 AND 20
                      OR EXISTS (SELECT 1 FROM jsonb_array_elements(e.j -> 'tags') AS t
                                  WHERE jsonb_typeof(t) <> 'string' OR length(t #>> '{}') NOT BETWEEN 1 AND 64))
                   THEN '"tags" must be an array of 1 to 20 strings of 1 to 64 characters'
                 WHEN e.j ? 'after' AND (jsonb_typeof(e.j -> 'after') <> 'array'
                      OR jsonb_array_length(e.j -> 'after') > 10000
                      OR EXISTS (SELECT 1 FROM jsonb_array_elements(e.j -> 'after') AS a
                                  WHERE NOT (jsonb_typeof(a) = 'string'
                                             OR (jsonb_typeof(a) = 'number' AND (a #>> '{}')::numeric >= 1
                                                 AND (a #>> '{}')::numeric <= 9223372036854775807
                                                 AND (a #>> '{}')::numeric = trunc((a #>> '{}')::numeric)))))
                   THEN '"after" must be an array of refs (strings) and job ids (positive integers)'
                 WHEN e.j ? 'on_parent_failure' AND (e.j ->> 'on_parent_failure') NOT IN ('cancel', 'run')
                   THEN '"on_parent_failure" must be "cancel" or "run"'
                 WHEN e.j ? 'callback' AND jsonb_typeof(e.j -> 'callback') <> 'boolean'
                   THEN '"callback" must be true or false'
               END AS why
          FROM jsonb_array_elements(v_jobs) WITH ORDINALITY AS e(j, o)
         CROSS JOIN LATERAL (SELECT jsonb_typeof(e.j) = 'object' AND jsonb_typeof(e.j -> 'run_at') = 'string'
                                    AND pgjobq.timestamp_ok(e.j ->> 'run_at') AS run_at_reads) rt
         -- (A delay is clamped to 30,000 years, still refused, so that the interval cannot overflow.)
         CROSS JOIN LATERAL (SELECT pgjobq.enqueue_when_why(
                                 CASE WHEN rt.run_at_reads THEN (e.j ->> 'run_at')::timestamptz END,
                                 CASE WHEN jsonb_typeof(e.j -> 'delay') = 'number'
                                      THEN make_interval(secs => least(greatest((e.j ->> 'delay')::numeric,
                                                                                -1e12), 1e12)::double precision)
                                 END,
                                 '"run_at"', '"delay"') AS why) w
         -- (Read only once the job's run_at, delay and expiry have read; the CASE above asks first.)
         CROSS JOIN LATERAL (SELECT CASE WHEN w.why IS NULL
                                          AND (jsonb_typeof(e.j -> 'expire_after') = 'number'
                                               OR (jsonb_typeof(e.j -> 'expires_at') = 'string'
                                                   AND pgjobq.timestamp_ok(e.j ->> 'expires_at')))
                                         THEN pgjobq.enqueue_expiry_why(
                                             coalesce(CASE WHEN rt.run_at_reads THEN (e.j ->> 'run_at')::timestamptz END,
                                                      now() + make_interval(secs => coalesce((e.j ->> 'delay')::double precision, 0))),
                                             CASE WHEN jsonb_typeof(e.j -> 'expires_at') = 'string'
                                                  THEN (e.j ->> 'expires_at')::timestamptz END,
                                             CASE WHEN jsonb_typeof(e.j -> 'expire_after') = 'number'
                                                  THEN make_interval(secs => least(greatest((e.j ->> 'expire_after')::numeric,
                                                                                            -1e12), 1e12)::double precision)
                                             END,
                                             '"expires_at"', '"expire_after"') END AS why) x
    LOOP
        IF v_bad.why IS NOT NULL THEN
            RAISE EXCEPTION 'pgjobq.enqueue_graph: job %: %', v_bad.i, v_bad.why
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    -- The bound on the work: the edges, beside the jobs.
    IF (SELECT sum(jsonb_array_length(e.j -> 'after')) FROM jsonb_array_elements(v_jobs) AS e(j)
         WHERE e.j ? 'after') > 100000 THEN
        RAISE EXCEPTION 'pgjobq.enqueue_graph: more than 100000 parents in one graph (split it, or enqueue the jobs of a fan-in first)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    SELECT array_agg(coalesce(e.j ->> 'ref', (e.o - 1)::text) ORDER BY e.o) INTO v_refs
      FROM jsonb_array_elements(v_jobs) WITH ORDINALITY AS e(j, o);
    SELECT d.r INTO v_bad FROM unnest(v_refs) AS d(r) GROUP BY d.r HAVING count(*) > 1 LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'pgjobq.enqueue_graph: two jobs have the ref "%"', v_bad.r
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The edges.  A string names a job of the graph by its ref; a number, a job already enqueued.
    SELECT jsonb_object_agg(r.ref, r.o) INTO v_refpos FROM unnest(v_refs) WITH ORDINALITY AS r(ref, o);
    SELECT array_agg(x.child), array_agg(x.pin), array_agg(x.pid), array_agg(x.queue)
      INTO v_e_child, v_e_in, v_e_out, v_e_queue
      FROM (SELECT DISTINCT e.o::integer AS child,
                   CASE WHEN jsonb_typeof(a) = 'string' THEN (v_refpos ->> (a #>> '{}'))::integer END AS pin,
                   CASE WHEN jsonb_typeof(a) = 'number' THEN (a #>> '{}')::numeric::bigint END AS pid,
                   CASE WHEN jsonb_typeof(a) = 'number' THEN coalesce(e.j ->> 'queue', 'default') END AS queue
              FROM jsonb_array_elements(v_jobs) WITH ORDINALITY AS e(j, o)
             CROSS JOIN LATERAL jsonb_array_elements(CASE WHEN e.j ? 'after' THEN e.j -> 'after' ELSE '[]' END) AS a) x;
    v_parents := array_fill(0, ARRAY[v_n]);
    v_kids := array_fill(0, ARRAY[v_n]);
    IF v_e_child IS NOT NULL THEN
        SELECT u.child, v_refs[u.child] AS cref, u.pin, u.pid INTO v_bad
          FROM unnest(v_e_child, v_e_in, v_e_out) AS u(child, pin, pid)
         WHERE (u.pin IS NULL AND u.pid IS NULL) OR u.pin = u.child LIMIT 1;
        IF FOUND THEN
            IF v_bad.pin = v_bad.child THEN
                RAISE EXCEPTION 'pgjobq.enqueue_graph: job "%" is after itself', v_bad.cref
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            RAISE EXCEPTION 'pgjobq.enqueue_graph: job "%" is after a ref that no job of the graph has', v_bad.cref
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        -- Cycle check (Kahn): take away the jobs none of whose parents in the graph is left, and with
        -- each one, count it off its children; what cannot be taken away is on a cycle (or after one).
        SELECT coalesce(array_agg(u.pin ORDER BY u.pin), '{}'), coalesce(array_agg(u.child ORDER BY u.pin), '{}')
          INTO v_g_par, v_g_kid
          FROM unnest(v_e_child, v_e_in) AS u(child, pin) WHERE u.pin IS NOT NULL;
        FOR v_k IN 1 .. cardinality(v_g_par) LOOP
            v_parents[v_g_kid[v_k]] := v_parents[v_g_kid[v_k]] + 1;
            v_kids[v_g_par[v_k]] := v_kids[v_g_par[v_k]] + 1;
        END LOOP;
        v_start := array_fill(0, ARRAY[v_n + 1]);
        v_k := 1;
        FOR v_p IN 1 .. v_n LOOP
            v_start[v_p] := v_k;
            v_k := v_k + v_kids[v_p];
        END LOOP;
        v_start[v_n + 1] := v_k;
        v_left := v_parents;
        v_order := array_fill(0, ARRAY[v_n]);
        v_tail := 0;
        FOR v_p IN 1 .. v_n LOOP
            IF v_left[v_p] = 0 THEN
                v_tail := v_tail + 1;
                v_order[v_tail] := v_p;
            END IF;
        END LOOP;
        v_head := 1;
        WHILE v_head <= v_tail LOOP
            v_p := v_order[v_head];
            v_head := v_head + 1;
            FOR v_k IN v_start[v_p] .. v_start[v_p + 1] - 1 LOOP
                v_c := v_g_kid[v_k];
                v_left[v_c] := v_left[v_c] - 1;
                IF v_left[v_c] = 0 THEN
                    v_tail := v_tail + 1;
                    v_order[v_tail] := v_c;
                END IF;
            END LOOP;
        END LOOP;
        IF v_tail < v_n THEN
            RAISE EXCEPTION 'pgjobq.enqueue_graph: the graph has a cycle through job "%"',
                            v_refs[(SELECT min(u.o) FROM unnest(v_left) WITH ORDINALITY AS u(l, o) WHERE u.l > 0)]
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        -- Parents outside the graph count too.
        FOR v_c IN SELECT u.child FROM unnest(v_e_child, v_e_out) AS u(child, pid) WHERE u.pid IS NOT NULL LOOP
            v_parents[v_c] := v_parents[v_c] + 1;
        END LOOP;
    END IF;

    -- Parents already enqueued (docs/workflows.md, "Parents outside the graph").  The rule: a job may
    -- be the parent of a job of its own queue; of a job of any queue when this transaction enqueued
    -- it; of any job when the caller may cross queues.  A parent that does not exist and one the rule
    -- refuses get the same error, which so tells nothing of other queues.  The rule is applied before
    -- any lock is taken: no caller holds up the completion of a job it may not depend on.
    v_ext := ARRAY(SELECT DISTINCT u.pid FROM unnest(v_e_out) AS u(pid) WHERE u.pid IS NOT NULL ORDER BY 1);
    IF cardinality(v_ext) > 0 THEN
        -- What each is: its queue, whether this transaction enqueued it (enqueued_here() is asked only
        -- of rows of this transaction's start), live or finished (ok: it completed).
        SELECT jsonb_object_agg(k.id::text, jsonb_build_object('queue', k.queue, 'here', k.here)),
               array_agg(k.id ORDER BY k.id) FILTER (WHERE k.ok IS NULL),
               array_agg(k.id ORDER BY k.id) FILTER (WHERE k.ok IS NOT NULL),
               array_agg(k.ok ORDER BY k.id) FILTER (WHERE k.ok IS NOT NULL),
               coalesce(bool_or(k.here), false)
          INTO v_known, v_seen, v_done, v_done_ok, v_any_here
          FROM (SELECT j.id, j.queue::text AS queue, NULL::boolean AS ok,
                       j.created_at = now() AND pgjobq.enqueued_here(j.id, j.xmin, j.created_at) AS here
                  FROM pgjobq.jobs j WHERE j.id = ANY (v_ext)
                UNION ALL
                SELECT h.id, h.queue, h.state = 'completed',
                       h.created_at = now() AND pgjobq.enqueued_here(h.id, h.xmin, h.created_at)
                  FROM pgjobq.history h WHERE h.id = ANY (v_ext)) k;
        SELECT min(u.pid) INTO v_badid FROM unnest(v_e_out, v_e_queue) AS u(pid, queue)
         WHERE u.pid IS NOT NULL
           AND (v_known -> u.pid::text ->> 'queue') IS DISTINCT FROM u.queue
           AND (v_known -> u.pid::text -> 'here') IS DISTINCT FROM 'true';
        IF v_badid IS NOT NULL AND pgjobq.caller_crosses_queues() THEN
            SELECT min(x) INTO v_badid FROM unnest(v_ext) AS x WHERE NOT coalesce(v_known ? x::text, false);
        END IF;
        IF v_badid IS NOT NULL THEN
            RAISE EXCEPTION 'pgjobq.enqueue_graph: job % cannot be a parent here: no such job in this queue or this transaction',
                            v_badid
                USING ERRCODE = 'foreign_key_violation';
        END IF;

        -- Lock the live ones in id order (their completion waits for this transaction, then sees the
        -- edges); the others are finished.  has_children is set here on the jobs this transaction
        -- enqueued, and on the others with the edges, below (see enqueued_here).
        v_live := ARRAY(SELECT j.id FROM pgjobq.jobs j WHERE j.id = ANY (v_ext) ORDER BY j.id FOR UPDATE);
        IF v_any_here THEN
            UPDATE pgjobq.jobs j SET has_children = true
             WHERE j.id = ANY (v_live) AND NOT j.has_children AND (v_known -> j.id::text -> 'here') = 'true';
        END IF;
        IF v_live IS DISTINCT FROM coalesce(v_seen, '{}') THEN
            -- One finished (or was retried, or pruned) between the read and the lock: read the finished
            -- ones again.
            SELECT jsonb_object_agg(x::text, true) INTO v_livemap FROM unnest(v_live) AS x;
            SELECT array_agg(h.id), array_agg(h.state = 'completed'), jsonb_object_agg(h.id::text, true)
              INTO v_done, v_done_ok, v_donemap
              FROM pgjobq.history h WHERE h.id = ANY (v_ext) AND NOT coalesce(v_livemap ? h.id::text, false);
            SELECT min(x) INTO v_badid FROM unnest(v_ext) AS x
             WHERE NOT coalesce(v_livemap ? x::text, false) AND NOT coalesce(v_donemap ? x::text, false);
            IF v_badid IS NOT NULL THEN
                RAISE EXCEPTION 'pgjobq.enqueue_graph: job % cannot be a parent here: no such job in this queue or this transaction',
                                v_badid
                    USING ERRCODE = 'foreign_key_violation';
            END IF;
        END IF;
    END IF;

    v_ids := ARRAY(SELECT nextval(v_seq) FROM generate_series(1, v_n));
    -- This transaction's id before the rows' ready_at (their claim key) is read: see claim.sql.
    PERFORM pg_current_xact_id();
    BEGIN
        WITH input AS (
            SELECT e.o::integer AS o, e.j, v_ids[e.o] AS id, v_parents[e.o] AS parents,
                   v_kids[e.o] > 0 AS has_children,
                   coalesce((e.j ->> 'run_at')::timestamptz,
                            now() + make_interval(secs => coalesce((e.j ->> 'delay')::double precision, 0))) AS run_at
              FROM jsonb_array_elements(v_jobs) WITH ORDINALITY AS e(j, o)),
        ins AS (
            INSERT INTO pgjobq.jobs (id, queue, kind, payload, priority, state, run_at, max_attempts,
                                     concurrency_key, tags, has_children, pending_parents, on_parent_failure,
                                     route_key, expires_at, traceparent)
            OVERRIDING SYSTEM VALUE
            SELECT i.id, coalesce(i.j ->> 'queue', 'default'), coalesce(i.j ->> 'kind', 'default'),
                   coalesce(i.j -> 'payload', '{}'), coalesce((i.j ->> 'priority')::numeric::smallint, 0),
                   CASE WHEN i.parents > 0 THEN 'waiting'::pgjobq.job_state ELSE 'queued'::pgjobq.job_state END,
                   i.run_at,
                   coalesce((i.j ->> 'max_attempts')::numeric::integer, 25), i.j ->> 'concurrency_key',
                   CASE WHEN i.j ? 'tags' THEN ARRAY(SELECT DISTINCT t FROM jsonb_array_elements_text(i.j -> 'tags') AS t ORDER BY 1) END,
                   i.has_children, CASE WHEN i.parents > 0 THEN i.parents END,
                   CASE WHEN i.parents = 0 THEN NULL
                        WHEN (i.j -> 'callback') = 'true' THEN 'batch'
                        ELSE coalesce(i.j ->> 'on_parent_failure', 'cancel') END,
                   i.j ->> 'route_key',
                   pgjobq.expiry_of(coalesce(i.j ->> 'queue', 'default'), i.run_at, (i.j ->> 'expires_at')::timestamptz,
                                    make_interval(secs => (i.j ->> 'expire_after')::double precision), v_expiry_defaults),
                   i.j ->> 'traceparent'
              FROM input i ORDER BY i.o
            RETURNING pgjobq.jobs.queue::text AS queue, pgjobq.jobs.state, pgjobq.jobs.run_at)
        SELECT array_agg(DISTINCT ins.queue) FILTER (WHERE ins.state = 'queued' AND ins.run_at <= now())
          INTO v_due FROM ins;
    EXCEPTION WHEN check_violation THEN
        RAISE EXCEPTION 'pgjobq.enqueue_graph: a job breaks a rule of pgjobq.jobs: %', SQLERRM
            USING ERRCODE = 'check_violation';
    END;
    PERFORM pgjobq.levels_record(array_agg(coalesce(e.j ->> 'queue', 'default')),
                                 array_agg(coalesce((e.j ->> 'priority')::numeric::smallint, 0::smallint)))
       FROM jsonb_array_elements(v_jobs) AS e(j);
    -- The edges, and has_children on the parents of other transactions, in a subtransaction of their
    -- own: such a parent's xmin is then the xmin of its new edges, which enqueued_here() reads as
    -- "not enqueued here".
    IF v_e_child IS NOT NULL THEN
        BEGIN
            UPDATE pgjobq.jobs j SET has_children = true WHERE j.id = ANY (v_live) AND NOT j.has_children;
            INSERT INTO pgjobq.deps (parent, child)
            SELECT coalesce(v_ids[u.pin], u.pid), v_ids[u.child]
              FROM unnest(v_e_child, v_e_in, v_e_out) AS u(child, pin, pid);
        EXCEPTION WHEN OTHERS THEN
            RAISE;   -- (the handler is what makes the block a subtransaction)
        END;
    END IF;
    PERFORM pgjobq.notify(v_due);

    -- Parents that had already finished count off now, as their completion would have.
    IF v_done IS NOT NULL THEN
        PERFORM pgjobq.children_release(v_done, v_done_ok, v_ids);
    END IF;

    RETURN QUERY SELECT r.ref, v_ids[r.o]::bigint FROM unnest(v_refs) WITH ORDINALITY AS r(ref, o) ORDER BY r.o;
END
$$;

-- timestamp_ok(t): whether t reads as a timestamptz (pg_input_is_valid arrives in 16).  Whether it is
-- a time a job may have is enqueue_when_why's to say ('infinity' reads, and is refused there).
CREATE OR REPLACE FUNCTION pgjobq.timestamp_ok(t text) RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM t::timestamptz;
    RETURN true;
EXCEPTION WHEN OTHERS THEN
    RETURN false;
END
$$;

-- enqueue_batch(jobs, callback): the jobs (an array, as for enqueue_graph, whose refs must not be
-- "callback") and a callback job that runs once, when every one of them has finished, however it
-- ended, with {"batch": {"id", "jobs", "completed", "failed", "cancelled"}} added to its payload.
-- Returns the callback's id (the batch's id) and the jobs' ids, in input order.
CREATE OR REPLACE FUNCTION pgjobq.enqueue_batch(jobs jsonb, callback jsonb DEFAULT '{}')
RETURNS TABLE (batch_id bigint, ids bigint[])
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_graph jsonb;
    v_ids   bigint[];
BEGIN
    IF jsonb_typeof(jobs) IS DISTINCT FROM 'array' OR jsonb_array_length(jobs) = 0 THEN
        RAISE EXCEPTION 'pgjobq.enqueue_batch: jobs must be a non-empty array' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_typeof(callback) IS DISTINCT FROM 'object' OR callback ?| ARRAY['after', 'ref', 'callback'] THEN
        RAISE EXCEPTION 'pgjobq.enqueue_batch: callback must be an object without "after", "ref" or "callback"'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT jsonb_agg(CASE WHEN jsonb_typeof(e.j) = 'object' AND NOT e.j ? 'ref'
                          THEN e.j || jsonb_build_object('ref', 'job ' || (e.o - 1)) ELSE e.j END ORDER BY e.o)
      INTO v_graph FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(j, o);
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(v_graph) AS j WHERE j ->> 'ref' = 'callback') THEN
        RAISE EXCEPTION 'pgjobq.enqueue_batch: the ref "callback" is the callback''s' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_graph := v_graph || jsonb_build_array(callback || jsonb_build_object(
        'ref', 'callback', 'callback', true,
        'after', (SELECT jsonb_agg(j -> 'ref') FROM jsonb_array_elements(v_graph) AS j)));
    SELECT array_agg(e.id ORDER BY e.ord) INTO v_ids
      FROM pgjobq.enqueue_graph(v_graph) WITH ORDINALITY AS e(ref, id, ord);
    RETURN QUERY SELECT v_ids[cardinality(v_ids)], v_ids[1:cardinality(v_ids) - 1];
END
$$;

-- parents(job): the jobs `job` waits (or waited) for, with their state and result ('pruned' when
-- retention has removed one).
CREATE OR REPLACE FUNCTION pgjobq.parents(job bigint)
RETURNS TABLE (id bigint, state text, kind text, result jsonb, finished_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
    SELECT d.parent, coalesce(a.state::text, 'pruned'), a.kind, a.result, a.finished_at
      FROM pgjobq.deps d LEFT JOIN pgjobq.all_jobs a ON a.id = d.parent
     WHERE d.child = $1 ORDER BY d.parent
$$;

-- children(job): the jobs that wait (or waited) for `job`.
CREATE OR REPLACE FUNCTION pgjobq.children(job bigint)
RETURNS TABLE (id bigint, state text, kind text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
    SELECT d.child, coalesce(a.state::text, 'pruned'), a.kind
      FROM pgjobq.deps d LEFT JOIN pgjobq.all_jobs a ON a.id = d.child
     WHERE d.parent = $1 ORDER BY d.child
$$;

-- graph(job): every job connected to `job` through parents and children (at most 10000), each with
-- its depth (the longest chain of parents above it within the graph) and its parents.
CREATE OR REPLACE FUNCTION pgjobq.graph(job bigint)
RETURNS TABLE (id bigint, depth integer, state text, queue text, kind text, parents bigint[])
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_nodes bigint[] := ARRAY[graph.job];
    v_more  bigint[];
    v_par   bigint[];
    v_chi   bigint[];
    v_left  bigint[];
    v_ready bigint[];
    v_at    bigint[] := '{}';
    v_depth integer[] := '{}';
    v_level integer;
BEGIN
    LOOP
        v_more := ARRAY(SELECT DISTINCT x FROM (
                            SELECT d.parent AS x FROM pgjobq.deps d WHERE d.child = ANY (v_nodes)
                            UNION SELECT d.child FROM pgjobq.deps d WHERE d.parent = ANY (v_nodes)) n
                         WHERE NOT (x = ANY (v_nodes)));
        EXIT WHEN cardinality(v_more) = 0 OR cardinality(v_nodes) >= 10000;
        v_nodes := v_nodes || v_more;
    END LOOP;
    -- Depth by layers (Kahn): a job's depth is one more than its deepest parent's.
    WITH e AS (SELECT d.parent, d.child FROM pgjobq.deps d WHERE d.child = ANY (v_nodes) AND d.parent = ANY (v_nodes))
    SELECT array_agg(e.parent), array_agg(e.child) INTO v_par, v_chi FROM e;
    v_left := v_nodes;
    v_level := 0;
    LOOP
        v_ready := ARRAY(SELECT l FROM unnest(v_left) AS l
                          WHERE NOT EXISTS (SELECT 1 FROM unnest(v_par, v_chi) AS u(p, c)
                                             WHERE u.c = l AND u.p = ANY (v_left)));
        EXIT WHEN cardinality(v_ready) = 0;
        v_at := v_at || v_ready;
        v_depth := v_depth || array_fill(v_level, ARRAY[cardinality(v_ready)]);
        v_left := ARRAY(SELECT l FROM unnest(v_left) AS l WHERE NOT (l = ANY (v_ready)));
        v_level := v_level + 1;
    END LOOP;
    RETURN QUERY
    SELECT u.n, u.dp, coalesce(a.state::text, 'pruned'), a.queue, a.kind,
           ARRAY(SELECT d.parent FROM pgjobq.deps d WHERE d.child = u.n ORDER BY 1)
      FROM unnest(v_at, v_depth) AS u(n, dp) LEFT JOIN pgjobq.all_jobs a ON a.id = u.n
     ORDER BY u.dp, u.n;
END
$$;

-- parents_json(job): [{"id", "state", "result"}, ...] of the job's parents, in id order.
CREATE OR REPLACE FUNCTION pgjobq.parents_json(job bigint) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object('id', d.parent, 'state', coalesce(a.state::text, 'pruned'),
                                                 'result', a.result) ORDER BY d.parent), '[]')
      FROM pgjobq.deps d LEFT JOIN pgjobq.all_jobs a ON a.id = d.parent
     WHERE d.child = $1
$$;
