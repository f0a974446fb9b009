-- pgjobq schema, migration 14: a claim steps over the rows other claims hold or have just taken,
-- without trying to lock them.
-- needs: 11
--
-- claim_next (sql/functions/claim.sql) reads a level from its cursor in key order and, until now,
-- tried to lock every queued row it met (FOR UPDATE SKIP LOCKED).  A row that another claim had
-- taken after this claim's snapshot was taken was still queued in that snapshot: READ COMMITTED
-- then locked its new, running version before the recheck dropped it, and held that lock to the end
-- of the claim, so the owner's heartbeat and completion (and other claims) waited for it.  Now a row
-- whose xmax is a transaction that was running when the claim began (it holds the row, or has
-- claimed it since) is stepped over without a lock attempt.  Any other xmax holds nothing (the
-- writer's own, or a transaction that ended before the claim began) and the row is claimed as
-- before.
--
-- The fenced writes (complete_many, fail_many, extend_many, release_many, cancel_many,
-- history_move_cancelled), rescue_expired and next_due run with jit = off, as claim_next did: they
-- turn plan types off, a node of a type turned off costs 1e10 to the planner, and their statements
-- were JIT-compiled whatever the data (fail_many's: about 1 s per call).
--
-- enqueue_many takes notify (default true): false leaves the notification to the caller, after its
-- commit.  The nine-argument form goes (a call with nine arguments, or fewer, now reaches the new
-- one: libraries of versions 11 to 13 call it so).
DROP FUNCTION IF EXISTS pgjobq.enqueue_many(text[], text[], jsonb[], smallint[], timestamptz[], interval[],
                                            integer[], text[], text[]);
--
-- Otherwise only functions change; this migration carries the version, so that a library of version 13
-- does not put its claim_next back.  Libraries of version 11 to 13 keep working: enqueue_many's new
-- argument has a default, and no other signature changed.
SELECT 1;
