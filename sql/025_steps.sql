-- pgjobq schema migration 25: durable execution's steps, sleeps and events (docs/durable.md).
-- needs: 24
--
--   pgjobq.job_steps     a job's stored steps: (job_id, name) -> result.  A step's result is stored
--                        by the holder of the job's lease (step_put, fenced by the lease token, in
--                        the holder's transaction, which may carry the step's own effects), and a
--                        later attempt reads it instead of running the step again.  The steps of a
--                        finished job stay while it is in the history and go when retention prunes
--                        it; a retry by hand of a completed job removes them (it starts over).
--   pgjobq.job_parks     why a queued job is parked and until when: a durable sleep (sleep) or a
--                        wait for an event (wait_event), which gave the attempt back and freed the
--                        lease.  The park is the job's current one while the job is queued under the
--                        lease token of the attempt that parked it (token): the claim that resumes
--                        the job draws a new token, so a park needs no clearing by the claim, and
--                        the claim and the completion of jobs that never park pay nothing.
--   pgjobq.events        events sent with send_event(name, key, payload), kept for
--                        pgjobq.event_retention() (7 days) and matched by every wait for their
--                        (name, key): an event sent before the wait began is found by the wait.
--
-- Nothing is added to pgjobq.jobs or pgjobq.history, and no index to pgjobq.jobs.
--
-- Libraries of version 24 keep working: nothing they call changed.

CREATE TABLE pgjobq.job_steps (
    job_id    bigint      NOT NULL,
    name      text        NOT NULL,
    result    jsonb       NOT NULL,
    attempt   integer     NOT NULL,
    stored_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT job_steps_pkey PRIMARY KEY (job_id, name),
    CONSTRAINT job_steps_name_length CHECK (length(name) BETWEEN 1 AND 255)
);

CREATE TABLE pgjobq.job_parks (
    job_id     bigint      NOT NULL,
    token      bigint      NOT NULL,
    why        text        NOT NULL,
    step       text        NOT NULL,
    until      timestamptz NOT NULL,
    event_name text,
    event_key  text,
    since      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT job_parks_pkey PRIMARY KEY (job_id),
    CONSTRAINT job_parks_why CHECK (why IN ('sleep', 'event')),
    CONSTRAINT job_parks_event_iff_wait CHECK ((why = 'event') = (event_name IS NOT NULL AND event_key IS NOT NULL))
);
-- send_event finds the jobs that wait for its (name, key) here.
CREATE INDEX job_parks_event_idx ON pgjobq.job_parks (event_name, event_key) WHERE why = 'event';

CREATE TABLE pgjobq.events (
    id      bigint      GENERATED ALWAYS AS IDENTITY,
    name    text        NOT NULL,
    key     text        NOT NULL,
    payload jsonb       NOT NULL,
    sent_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT events_pkey PRIMARY KEY (id),
    CONSTRAINT events_name_length CHECK (length(name) BETWEEN 1 AND 255),
    CONSTRAINT events_key_length CHECK (length(key) <= 255)
);
-- A wait takes the first event of its (name, key) still kept.
CREATE INDEX events_name_key_idx ON pgjobq.events (name, key, id);
-- Retention removes the oldest.
CREATE INDEX events_sent_idx ON pgjobq.events (sent_at);
