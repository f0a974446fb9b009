-- pgjobq roles: least privilege, optional.  Applied by `pgjobq migrate --roles` (pgjobq_migrate_roles)
-- after the migrations, by the owner of the pgjobq schema, with CREATEROLE while a role is missing.
-- Idempotent.  Once it has been applied to a database, every `pgjobq migrate` that applies the
-- function files applies it again (when all four roles exist), so that a function a migration
-- dropped and the files created again is granted again; that needs no CREATEROLE.
--
--   pgjobq_producer  may enqueue, nothing else: it can neither read nor change other jobs.
--   pgjobq_worker    may claim, complete, fail, heartbeat, hand back, and run maintenance (pruning
--                    no shorter than the configured retention, pgjobq.retention).
--   pgjobq_admin     both of the above, plus reading jobs, statistics, cancel and retry, queue
--                    settings (pause, resume, limits), and the retention (setting it, pruning below it).
--   pgjobq_monitor   reading only: jobs, history, queues, schedules, workers and tallies (the tables,
--                    and the monitor_* functions that `pgjobq serve` reads them through); all that
--                    `pgjobq serve` needs without --allow-actions.
--   pgjobq_cross_queue  no privilege of its own: its members may make a job of any queue the parent
--                    of a new job (enqueue's after, enqueue_graph; docs/workflows.md).  Without it a
--                    parent must be of the child's queue or enqueued in the same transaction.
--                    pgjobq_admin is a member.  Grant it with the producer role to a producer that
--                    builds workflows across queues: GRANT pgjobq_cross_queue TO my_app;
--
-- No role reads a job's lease token (the admin's and the monitor's SELECT on the jobs is granted
-- column by column, every column but lease_token): the token is the holder's secret, which fences
-- its writes, and only a claim returns it, to its claimer.  Nor a worker's secret_hash (the row of
-- pgjobq.workers belongs to the worker that knows the secret: sql/functions/monitor.sql).
--
-- Grant them to login roles: GRANT pgjobq_producer TO my_app;  GRANT pgjobq_worker TO my_workers;
-- The transitions are SECURITY DEFINER functions with a pinned search_path, so none of these roles
-- needs (or gets) privileges on the jobs table itself, except the SELECT of pgjobq_admin and
-- pgjobq_monitor (every column but lease_token).

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'pgjobq_producer') THEN
        CREATE ROLE pgjobq_producer NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'pgjobq_worker') THEN
        CREATE ROLE pgjobq_worker NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'pgjobq_admin') THEN
        CREATE ROLE pgjobq_admin NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'pgjobq_monitor') THEN
        CREATE ROLE pgjobq_monitor NOLOGIN;
    END IF;
END
$$;

GRANT USAGE ON SCHEMA pgjobq TO pgjobq_producer, pgjobq_worker, pgjobq_admin, pgjobq_monitor;

GRANT EXECUTE ON FUNCTION
    pgjobq.enqueue(text, text, jsonb, smallint, timestamptz, interval, integer, text, text, bigint[], text[], text,
                   text, text, interval, timestamptz, interval, text),
    pgjobq.enqueue_keyed(text[], text[], jsonb[], smallint[], timestamptz[], interval[], integer[], text[], text[],
                         interval[], text[], boolean, text[], timestamptz[], interval[], text[]),
    pgjobq.enqueue_graph(jsonb),
    pgjobq.enqueue_batch(jsonb, jsonb),
    pgjobq.enqueue_many(text[], text[], jsonb[], smallint[], timestamptz[], interval[], integer[], text[], text[],
                        boolean, text[], timestamptz[], interval[], text[]),
    pgjobq.reserve_ids(integer),
    pgjobq.notify(text[]),
    pgjobq.levels_add(text[], smallint[]),
    pgjobq.job_defaults(),
    pgjobq.enqueue_when_check(timestamptz[], interval[], integer[]),
    pgjobq.expiry_defaults(),
    pgjobq.forward(text, text, jsonb, smallint, timestamptz, interval, integer, text, text, text),
    pgjobq.outbox_queue(),
    pgjobq.outbox_self()
TO pgjobq_producer;
-- (The forwarder, run by workers, writes what producers forwarded to the job's shard.)
GRANT EXECUTE ON FUNCTION pgjobq.enqueue_forwarded(uuid, bigint, jsonb) TO pgjobq_producer, pgjobq_worker;
-- (pgjobq_producer is not granted INSERT on pgjobq.jobs: with it, the library would enqueue large
-- batches with COPY, but a producer could also choose ids the sequence has not issued yet and make
-- later enqueues fail.  Grant INSERT (id, queue, kind, payload, priority, run_at, max_attempts) ON
-- pgjobq.jobs to a producer you trust with that; pgjobq_enqueue_many uses COPY when it may.)

GRANT EXECUTE ON FUNCTION
    pgjobq.claim(text, integer, interval, text),
    pgjobq.claim_batch(text, integer, interval, text, smallint, timestamptz, bigint),
    pgjobq.claim_next(text, integer, interval, text, smallint[], timestamptz[], bigint[], timestamptz[], bigint[],
                      boolean, boolean),
    pgjobq.complete_many(bigint[], bigint[], jsonb[]),
    pgjobq.fail_many(bigint[], bigint[], text[], interval[], boolean[]),
    pgjobq.extend_many(bigint[], bigint[], interval),
    pgjobq.progress_many(bigint[], bigint[], jsonb[]),
    pgjobq.release_many(bigint[], bigint[], text),
    pgjobq.cancel_many(bigint[], bigint[], text),
    pgjobq.snooze_many(bigint[], bigint[], text[], interval[]),
    pgjobq.snooze_many(bigint[], bigint[], text[], interval[], boolean[]),
    pgjobq.next_due(text),
    pgjobq.rescue_expired(integer, timestamptz),
    pgjobq.expire_queued(integer),
    pgjobq.age_priorities(integer),
    pgjobq.prune(interval, interval, integer),
    pgjobq.cron_next(text, text, timestamptz),
    pgjobq.cron_field(text, integer, integer, text[], text),
    pgjobq.cron_instant(timestamp, text),
    pgjobq.schedule_tick(integer),
    pgjobq.worker_beat(text, text, integer, text, text, bigint, text),
    pgjobq.worker_gone(text, bigint),
    pgjobq.set_progress(bigint, bigint, jsonb),
    pgjobq.parents(bigint),
    pgjobq.health(),
    pgjobq.health_facts(),
    pgjobq.monitor_unhealthy_workers(),
    pgjobq.autovacuum_adapt(),
    pgjobq.step_get(bigint, bigint, text),
    pgjobq.steps_of(bigint, bigint),
    pgjobq.step_put(bigint, bigint, text, jsonb),
    pgjobq.sleep(bigint, bigint, text, interval),
    pgjobq.wait_event(bigint, bigint, text, text, text, interval)
TO pgjobq_worker;
-- Events (sql/functions/steps.sql): a producer's transaction sends them, and so may a job's.
GRANT EXECUTE ON FUNCTION pgjobq.send_event(text, text, jsonb) TO pgjobq_producer, pgjobq_worker;

-- pgjobq_admin is both of the above.  Granted only when it is not yet: granting a membership needs
-- CREATEROLE even when it changes nothing, and `pgjobq migrate` applies this file again (after the
-- function files) wherever the roles exist, as the schema's owner, who may not have CREATEROLE.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_auth_members m
                    WHERE m.roleid = 'pgjobq_producer'::regrole AND m.member = 'pgjobq_admin'::regrole) THEN
        GRANT pgjobq_producer TO pgjobq_admin;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_auth_members m
                    WHERE m.roleid = 'pgjobq_worker'::regrole AND m.member = 'pgjobq_admin'::regrole) THEN
        GRANT pgjobq_worker TO pgjobq_admin;
    END IF;
END
$$;
-- pgjobq_cross_queue came after the other four: where they exist, `pgjobq migrate` applies this file
-- again as the schema's owner, who may not have CREATEROLE.  Then the role is left for `pgjobq migrate
-- --roles` (with CREATEROLE) to create, with a warning: until it exists, only the schema's owner and
-- superusers may cross queues (caller_crosses_queues() in sql/functions/workflows.sql).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'pgjobq_cross_queue') THEN
        IF NOT (SELECT r.rolsuper OR r.rolcreaterole FROM pg_catalog.pg_roles r WHERE r.rolname = current_user) THEN
            RAISE WARNING 'pgjobq: the role pgjobq_cross_queue does not exist and % may not create it: run `pgjobq migrate --roles` as a role with CREATEROLE',
                current_user;
            RETURN;
        END IF;
        CREATE ROLE pgjobq_cross_queue NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_auth_members m
                    WHERE m.roleid = 'pgjobq_cross_queue'::regrole AND m.member = 'pgjobq_admin'::regrole) THEN
        GRANT pgjobq_cross_queue TO pgjobq_admin;
    END IF;
END
$$;
GRANT EXECUTE ON FUNCTION pgjobq.cancel(bigint), pgjobq.retry(bigint), pgjobq.retry_running(bigint), pgjobq.stats(),
    pgjobq.sequence_skip(bigint) TO pgjobq_admin;
GRANT EXECUTE ON FUNCTION pgjobq.children(bigint), pgjobq.graph(bigint) TO pgjobq_admin, pgjobq_monitor;
GRANT EXECUTE ON FUNCTION pgjobq.parents(bigint) TO pgjobq_monitor;
GRANT SELECT ON pgjobq.deps TO pgjobq_admin, pgjobq_monitor;
GRANT EXECUTE ON FUNCTION pgjobq.queue_pause(text, text), pgjobq.queue_resume(text), pgjobq.queue_set(text, jsonb),
    pgjobq.queue_list(), pgjobq.schedule_set(text, text, text, text, text, jsonb, smallint, integer, text),
    pgjobq.schedule_enable(text, boolean), pgjobq.schedule_delete(text), pgjobq.schedule_list(),
    pgjobq.schedule_trigger(text), pgjobq.schedule_sync(jsonb),
    pgjobq.retry_where(text, text, text, interval, boolean, boolean),
    pgjobq.cancel_where(text, text, text, interval, boolean) TO pgjobq_admin;
GRANT SELECT ON pgjobq.queues, pgjobq.schedules, pgjobq.dead_letters, pgjobq.sequence_blocks TO pgjobq_admin;
-- The retention workers keep: the admin sets it (and may prune below it), the monitor reads it.
GRANT EXECUTE ON FUNCTION pgjobq.retention_set(interval, interval) TO pgjobq_admin;
GRANT SELECT ON pgjobq.retention TO pgjobq_admin, pgjobq_monitor;

GRANT SELECT ON pgjobq.tallies TO pgjobq_admin;
GRANT SELECT ON pgjobq.queues, pgjobq.schedules, pgjobq.tallies, pgjobq.dead_letters, pgjobq.sequence_blocks
    TO pgjobq_monitor;

-- The jobs, live and finished, and the workers: every column but the secrets (a job's lease_token, a
-- worker's secret_hash), to the admin and the monitor.  The table-level SELECT this file granted
-- before schema 11 is taken back first (which takes the column grants with it; they are given again
-- below).  The columns come from the catalog, so a column that a later migration adds is granted
-- whenever this file is applied again.
REVOKE SELECT ON pgjobq.jobs, pgjobq.history, pgjobq.all_jobs, pgjobq.workers FROM pgjobq_admin, pgjobq_monitor;
DO $$
DECLARE
    v_rel regclass;
BEGIN
    FOREACH v_rel IN ARRAY ARRAY['pgjobq.jobs', 'pgjobq.history', 'pgjobq.all_jobs', 'pgjobq.workers']::regclass[] LOOP
        EXECUTE (SELECT format('GRANT SELECT (%s) ON %s TO pgjobq_admin, pgjobq_monitor',
                               string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum), v_rel)
                   FROM pg_catalog.pg_attribute a
                  WHERE a.attrelid = v_rel AND a.attnum > 0 AND NOT a.attisdropped
                    AND a.attname NOT IN ('lease_token', 'secret_hash'));
    END LOOP;
END
$$;
GRANT EXECUTE ON FUNCTION pgjobq.stats(), pgjobq.queue_list(), pgjobq.schedule_list(), pgjobq.health(),
    pgjobq.health_facts() TO pgjobq_monitor;
-- What `pgjobq serve` reads, through the monitor functions (sql/functions/monitor.sql): to the monitor,
-- which needs nothing else for the dashboard without --allow-actions, and to the admin.
GRANT EXECUTE ON FUNCTION pgjobq.monitor_queue_counts(), pgjobq.queue_ready(text), pgjobq.monitor_queue_names(), pgjobq.monitor_overview(),
    pgjobq.monitor_finished_per_minute(), pgjobq.monitor_failures(integer),
    pgjobq.monitor_jobs(text, text, text, text, bigint, text, integer), pgjobq.monitor_job(bigint),
    pgjobq.monitor_workers(text, text, integer), pgjobq.monitor_unhealthy_workers(),
    pgjobq.monitor_finished(timestamptz, timestamptz, float8[]),
    pgjobq.monitor_tallies(timestamptz, timestamptz), pgjobq.monitor_history_counts(),
    pgjobq.monitor_run(bigint, bigint), pgjobq.monitor_queue_live(text), pgjobq.monitor_queue_drained(text),
    pgjobq.monitor_queue_first_live(text, bigint), pgjobq.monitor_dead_letters(bigint), pgjobq.monitor_last_id(), pgjobq.monitor_latency(text, bigint), pgjobq.monitor_pickup_lag(text, bigint), pgjobq.monitor_storage()
TO pgjobq_admin, pgjobq_monitor;
-- One job, live or finished (sql/functions/monitor.sql): with the caller's rights, to who may read jobs.
GRANT EXECUTE ON FUNCTION pgjobq.job_get(bigint) TO pgjobq_admin, pgjobq_monitor;
-- A job's steps and park, and the counts of parked jobs (sql/functions/steps.sql): to who may read jobs.
GRANT EXECUTE ON FUNCTION pgjobq.steps(bigint), pgjobq.job_park_of(bigint), pgjobq.monitor_parked()
TO pgjobq_admin, pgjobq_monitor;
-- Waiting for a job to finish (sql/functions/await.sql): to who may read the job.
GRANT EXECUTE ON FUNCTION pgjobq.await_begin(bigint), pgjobq.await_end(bigint) TO pgjobq_admin, pgjobq_monitor;
-- What the benchmarks start from (sql/functions/admin.sql): removing a queue's jobs, loading history.
GRANT EXECUTE ON FUNCTION pgjobq.reset_queue(text), pgjobq.load_history(text, bigint) TO pgjobq_admin;
-- The cluster map (sql/functions/cluster.sql): every role reads it (a client routes by it; the tables
-- are readable by PUBLIC: the grant of the migration that made them), the admin installs it.
GRANT EXECUTE ON FUNCTION pgjobq.route_hash(text), pgjobq.route_partition(text, text), pgjobq.route_job(bigint),
    pgjobq.cluster_map()
TO pgjobq_producer, pgjobq_worker, pgjobq_admin, pgjobq_monitor;
GRANT EXECUTE ON FUNCTION pgjobq.cluster_set(jsonb, text) TO pgjobq_admin;
