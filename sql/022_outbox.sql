-- pgjobq schema migration 22: the outbox, which moves a job from the database its producer writes to
-- (in the producer's own transaction) to the shard that owns it, exactly once (docs/shards.md, "The
-- outbox").
-- needs: 21
--
--   pgjobq.outbox_self   one row: this database's label as a source of forwarded jobs, a random uuid
--                        made here.  A physical standby has the same label (it is the same database,
--                        which is right: after a failover its outbox goes on where it stopped); a copy
--                        made with pg_dump gets it too, and must be given a new one
--                        (UPDATE pgjobq.outbox_self SET label = gen_random_uuid()).
--   pgjobq.forwarded     in a shard: the jobs forwarded to it, by (source label, id of the outbox job
--                        at the source) -> the id of the job made here.  A forwarder that made the job
--                        and died before it completed the outbox job forwards it again after its lease
--                        ends, and finds the row: the same job, not a second one.  Rows are kept 30
--                        days (prune), far longer than an outbox job is retried.
--
-- Libraries of version 21 keep working: nothing they call changed.

CREATE TABLE pgjobq.outbox_self (
    one   boolean NOT NULL DEFAULT true,
    label uuid    NOT NULL DEFAULT gen_random_uuid(),
    CONSTRAINT outbox_self_pkey PRIMARY KEY (one),
    CONSTRAINT outbox_self_one_row CHECK (one)
);
INSERT INTO pgjobq.outbox_self DEFAULT VALUES;

CREATE TABLE pgjobq.forwarded (
    source    uuid        NOT NULL,
    source_id bigint      NOT NULL,
    id        bigint,
    at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT forwarded_pkey PRIMARY KEY (source, source_id)
);
CREATE INDEX forwarded_at ON pgjobq.forwarded (at);
