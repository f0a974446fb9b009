-- pgjobq schema migration 24: waiting for a job to finish, woken by a notification (docs/durable.md,
-- "Awaiting a result").
-- needs: 23
--
--   pgjobq.awaited          who waits for which job: (job_id, pid, the waiting session's backend),
--                           added by await_begin, removed by await_end, and by prune once the session
--                           is gone.  UNLOGGED: a wait does not outlive a crash, which ends its session.
--   history_awaited         a statement trigger on pgjobq.history: after a statement that moved jobs
--                           to the history (every way a job finishes does), when somebody waits, one
--                           NOTIFY pgjobq_done with the ids of the awaited jobs now finished.  When
--                           nobody waits it reads an empty table and sends nothing: no notification
--                           (and no notification lock at commit) for jobs nobody awaits.
--
-- Libraries of version 23 keep working: nothing they call changed.

CREATE UNLOGGED TABLE pgjobq.awaited (
    job_id bigint      NOT NULL,
    pid    integer     NOT NULL,
    since  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT awaited_pkey PRIMARY KEY (job_id, pid)
);

-- (A trigger's function lives with its trigger, as 017's does.)  The ids of the awaited jobs the
-- history now holds, comma-separated; an empty payload when they would not fit in one (8000 bytes):
-- then every waiter reads its job again.
CREATE FUNCTION pgjobq.history_awaited() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ids text;
BEGIN
    IF NOT EXISTS (SELECT FROM pgjobq.awaited) THEN
        RETURN NULL;
    END IF;
    SELECT string_agg(DISTINCT a.job_id::text, ',') INTO v_ids
      FROM pgjobq.awaited a WHERE EXISTS (SELECT FROM pgjobq.history h WHERE h.id = a.job_id);
    IF v_ids IS NOT NULL THEN
        PERFORM pg_notify('pgjobq_done', CASE WHEN length(v_ids) <= 7900 THEN v_ids ELSE '' END);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER history_awaited AFTER INSERT ON pgjobq.history
    FOR EACH STATEMENT EXECUTE FUNCTION pgjobq.history_awaited();
