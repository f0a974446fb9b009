-- pgjobq functions: the cluster map, for a database that is one shard of several, or their router
-- (docs/shards.md).  Where a job lives, the map as JSON, installing a map, and the shard's guard.
-- router: also
--
-- Applied by `pgjobq migrate` with the other files of sql/functions (docs/hacking.md), and (the line
-- above: tools/embed-sql.awk) by `pgjobq migrate --router` to a router database, which has the map's
-- tables but no jobs: what touches pgjobq.jobs here is PL/pgSQL, resolved when it runs, and runs only
-- in a shard.

-- route_hash(key): FNV-1a, 32 bits, over the key's UTF-8 bytes, as a bigint from 0 to 4294967295 (the
-- unsigned value, which an int4 could not hold).  The C library computes the same (pgjobq__route_hash,
-- held equal by tests/test_cluster.c), so that a client routes without asking.  Not hashtext(), whose
-- value depends on PostgreSQL's version and which no client computes.  About 0.7 µs a byte (9 µs for
-- a 12-byte key): a loop of PL/pgSQL expressions, byte by byte (FNV-1a is sequential; a loop unrolled
-- by four was no faster, an SQL aggregate ten times slower).  Neither SECURITY DEFINER nor SET: it
-- reads nothing, names only pg_catalog's operators, and a SET would cost more than the hash.
CREATE OR REPLACE FUNCTION pgjobq.route_hash(key text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    b bytea := pg_catalog.convert_to(key, 'UTF8');
    h bigint := 2166136261;
    i integer;
BEGIN
    FOR i IN 0 .. pg_catalog.length(b) - 1 LOOP
        h := ((h OPERATOR(pg_catalog.#) pg_catalog.get_byte(b, i)) OPERATOR(pg_catalog.*) 16777619)
             OPERATOR(pg_catalog.&) 4294967295;
    END LOOP;
    RETURN h;
END
$$;

-- route_partition(queue, route_key): the partition (0 .. P - 1) a job of the queue (NULL: 'default')
-- with that routing key lives on, by the map of this database: for a spread queue and a key,
-- route_hash(key) & (P - 1); else the queue's own partition, the map's (cluster_queues.partition) or
-- route_hash(queue) & (P - 1).  (A job of a spread queue without a key lives where a pinned queue's
-- would: so do its schedules.)  55000 (object_not_in_prerequisite_state) in a database with no map.
CREATE OR REPLACE FUNCTION pgjobq.route_partition(queue text, route_key text DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_p     integer;
    v_place text;
    v_part  integer;
    v_queue text := coalesce(route_partition.queue, 'default');
BEGIN
    SELECT c.partitions INTO v_p FROM pgjobq.cluster c;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgjobq.route_partition: this database has no cluster map (pgjobq.cluster_set installs one)'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    SELECT q.placement, q.partition INTO v_place, v_part FROM pgjobq.cluster_queues q WHERE q.queue = v_queue;
    IF v_place = 'spread' AND route_partition.route_key IS NOT NULL THEN
        RETURN pgjobq.route_hash(route_partition.route_key) & (v_p - 1);
    END IF;
    RETURN coalesce(v_part, pgjobq.route_hash(v_queue) & (v_p - 1));
END
$$;

-- route_job(id): the shard that handed out job id, by this database's map: the shard whose number
-- the id ends in (id % 1024), or NULL when the id is at most the map's id_floor (handed out before the
-- cluster: any shard may hold it, look on each) or no shard of the map has that number.  (cluster_set
-- says how a shard's ids are made.)  55000 (object_not_in_prerequisite_state) in a database with no map.
CREATE OR REPLACE FUNCTION pgjobq.route_job(id bigint) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_floor bigint;
    v_shard text;
BEGIN
    SELECT c.id_floor INTO v_floor FROM pgjobq.cluster c;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgjobq.route_job: this database has no cluster map (pgjobq.cluster_set installs one)'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF route_job.id > v_floor THEN
        SELECT s.name INTO v_shard FROM pgjobq.cluster_shards s WHERE s.number = route_job.id % 1024;
    END IF;
    RETURN v_shard;
END
$$;

-- cluster_map(): the map this database holds, as cluster_set takes it, with its own name (self: NULL
-- in a router); NULL when it has none.
--   {"name": "jobs", "epoch": 3, "partitions": 64, "id_floor": 0, "self": "a",
--    "shards": {"a": {"number": 0, "conninfo": "host=db-a dbname=jobs"}, "b": {...}},
--    "owners": ["a", "a", ..., "b"],                       (the owner of partition 0, 1, ... P - 1)
--    "queues": {"mail": {"placement": "pinned", "partition": 5}, "tenant_jobs": {"placement": "spread"}}}
CREATE OR REPLACE FUNCTION pgjobq.cluster_map() RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT jsonb_build_object(
               'name', c.name, 'epoch', c.epoch, 'partitions', c.partitions, 'id_floor', c.id_floor, 'self', c.self,
               'shards', (SELECT jsonb_object_agg(s.name, jsonb_build_object('number', s.number, 'conninfo', s.conninfo))
                            FROM pgjobq.cluster_shards s),
               'owners', (SELECT jsonb_agg(o.shard ORDER BY o.partition) FROM pgjobq.cluster_owners o),
               'queues', coalesce((SELECT jsonb_object_agg(q.queue, jsonb_strip_nulls(jsonb_build_object(
                                                             'placement', q.placement, 'partition', q.partition)))
                                     FROM pgjobq.cluster_queues q), '{}'::jsonb))
      FROM pgjobq.cluster c
$$;

-- cluster_conninfo_why(conninfo): why a shard's conninfo is refused, NULL when it is not.  A password
-- in the map would be read by every role (the map is no secret) and by every log that prints it: use
-- ~/.pgpass, a service file or a client certificate.  Both forms are read: key=value (a `password`
-- key) and URI (a password after the user, or a password parameter).  A conninfo that merely mentions
-- the word in a value is refused too: refusing is the safe mistake.
CREATE OR REPLACE FUNCTION pgjobq.cluster_conninfo_why(conninfo text) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE
             WHEN conninfo IS NULL OR length(conninfo) NOT BETWEEN 1 AND 4096
               THEN 'a conninfo is a string of 1 to 4096 characters'
             WHEN conninfo ~* '^postgres(ql)?://'
                  AND (conninfo ~ '^[^:]+://[^/?#@]*:[^/?#@]*@' OR conninfo ~* '[?&]password=')
               THEN 'a conninfo must not carry a password (use ~/.pgpass, a service file or a client certificate)'
             WHEN conninfo !~* '^postgres(ql)?://' AND conninfo ~* '(^|\s)password\s*='
               THEN 'a conninfo must not carry a password (use ~/.pgpass, a service file or a client certificate)'
           END
$$;

-- cluster_map_why(map): why a map is refused, NULL when it is well formed (cluster_set then compares it
-- with the map installed).  Every key known; name a name; epoch an integer from 1 to 2^31 - 1 (PL/Proxy's
-- cluster version is an int4); partitions a power of two from 1 to 4096 (64 when left out); id_floor
-- an integer, not negative (0 when left out); shards an object of at least one shard, each with a
-- number from 0 to 1023 (unique) and a conninfo without a password; owners an array of P shard names
-- (every partition has an owner among the shards); queues an object of queue names, each pinned
-- (optionally to a partition below P) or spread.
CREATE OR REPLACE FUNCTION pgjobq.cluster_map_why(map jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_name_re constant text := '^[A-Za-z][A-Za-z0-9_.:-]*$';
    v_p       integer;
    v_why     text;
BEGIN
    -- (CASE, not OR, wherever a cast must come after the test of the type: CASE keeps its order.)
    IF jsonb_typeof(map) IS DISTINCT FROM 'object' THEN
        RETURN 'the map must be a JSON object';
    END IF;
    SELECT 'unknown key "' || k || '"' INTO v_why FROM jsonb_object_keys(map) AS k
     WHERE k NOT IN ('name', 'epoch', 'partitions', 'id_floor', 'self', 'shards', 'owners', 'queues') ORDER BY k LIMIT 1;
    v_why := coalesce(v_why, CASE
        WHEN NOT pgjobq.cluster_is_name(map -> 'name')
          THEN '"name" must be a name: a letter, then letters, digits, _ . : or -, 64 at most'
        WHEN NOT pgjobq.cluster_is_int(map -> 'epoch', 1, 2147483647)
          THEN '"epoch" must be an integer from 1 to 2147483647'
        WHEN map ? 'partitions' AND NOT (pgjobq.cluster_is_int(map -> 'partitions', 1, 4096)
                                         AND ((map ->> 'partitions')::integer & ((map ->> 'partitions')::integer - 1)) = 0)
          THEN '"partitions" must be a power of two from 1 to 4096'
        WHEN map ? 'id_floor' AND NOT pgjobq.cluster_is_int(map -> 'id_floor', 0, 4611686018427387904)
          THEN '"id_floor" must be an integer from 0 to 2^62'
        WHEN jsonb_typeof(map -> 'shards') IS DISTINCT FROM 'object' OR map -> 'shards' = '{}'
          THEN '"shards" must be an object of at least one shard: {"name": {"number": N, "conninfo": "..."}}'
        WHEN map ? 'queues' AND jsonb_typeof(map -> 'queues') <> 'object'
          THEN '"queues" must be an object: {"queue": {"placement": "pinned" or "spread", "partition": N}}'
    END);
    IF v_why IS NOT NULL THEN
        RETURN v_why;
    END IF;
    v_p := coalesce((map ->> 'partitions')::integer, 64);

    SELECT format('shard "%s": %s', s.k, s.why) INTO v_why
      FROM (SELECT e.k, CASE
                   WHEN NOT pgjobq.cluster_is_name(to_jsonb(e.k))
                     THEN 'not a name: a letter, then letters, digits, _ . : or -, 64 at most'
                   WHEN jsonb_typeof(e.v) IS DISTINCT FROM 'object'
                        OR EXISTS (SELECT FROM jsonb_object_keys(e.v) AS x WHERE x NOT IN ('number', 'conninfo'))
                     THEN 'must be an object with "number" and "conninfo", and nothing else'
                   WHEN NOT pgjobq.cluster_is_int(e.v -> 'number', 0, 1023)
                     THEN '"number" must be an integer from 0 to 1023'
                   WHEN jsonb_typeof(e.v -> 'conninfo') IS DISTINCT FROM 'string'
                     THEN '"conninfo" must be a string'
                   ELSE pgjobq.cluster_conninfo_why(e.v ->> 'conninfo') END AS why
              FROM jsonb_each(map -> 'shards') AS e(k, v)) s
     WHERE s.why IS NOT NULL ORDER BY s.k LIMIT 1;
    IF v_why IS NOT NULL THEN
        RETURN v_why;
    END IF;
    SELECT format('shards "%s" have the same number, %s', string_agg(s.k, '" and "' ORDER BY s.k), s.v ->> 'number')
      INTO v_why FROM jsonb_each(map -> 'shards') AS s(k, v)
     GROUP BY s.v ->> 'number' HAVING count(*) > 1 ORDER BY 1 LIMIT 1;
    IF v_why IS NOT NULL THEN
        RETURN v_why;
    END IF;
    IF jsonb_typeof(map -> 'owners') IS DISTINCT FROM 'array' OR jsonb_array_length(map -> 'owners') <> v_p THEN
        RETURN format('"owners" must be an array of %s shard names, the owner of each partition', v_p);
    END IF;
    SELECT format('owners[%s] is %s, which is no shard of the map', o.i - 1, o.v) INTO v_why
      FROM jsonb_array_elements(map -> 'owners') WITH ORDINALITY AS o(v, i)
     WHERE CASE WHEN jsonb_typeof(o.v) <> 'string' THEN true ELSE NOT (map -> 'shards') ? (o.v #>> '{}') END
     ORDER BY o.i LIMIT 1;
    IF v_why IS NOT NULL THEN
        RETURN v_why;
    END IF;
    SELECT format('queue "%s": %s', q.k, q.why) INTO v_why
      FROM (SELECT e.k, CASE
                   WHEN NOT pgjobq.cluster_is_name(to_jsonb(e.k))
                     THEN 'not a queue name: a letter, then letters, digits, _ . : or -, 64 at most'
                   WHEN jsonb_typeof(e.v) IS DISTINCT FROM 'object'
                        OR EXISTS (SELECT FROM jsonb_object_keys(e.v) AS x WHERE x NOT IN ('placement', 'partition'))
                        OR (e.v ->> 'placement') IS DISTINCT FROM 'pinned' AND (e.v ->> 'placement') IS DISTINCT FROM 'spread'
                     THEN 'must be {"placement": "pinned"} (optionally with "partition") or {"placement": "spread"}'
                   WHEN e.v ? 'partition' AND ((e.v ->> 'placement') <> 'pinned'
                                               OR NOT pgjobq.cluster_is_int(e.v -> 'partition', 0, v_p - 1))
                     THEN format('"partition" must be an integer from 0 to %s, and only for a pinned queue', v_p - 1)
                   END AS why
              FROM jsonb_each(coalesce(map -> 'queues', '{}')) AS e(k, v)) q
     WHERE q.why IS NOT NULL ORDER BY q.k LIMIT 1;
    RETURN v_why;
END
$$;

-- cluster_is_name(v), cluster_is_int(v, lo, hi): whether a JSON value is a name (of a cluster, a shard,
-- a queue: pgjobq.identifier's rule), or an integer from lo to hi.  For cluster_map_why.
CREATE OR REPLACE FUNCTION pgjobq.cluster_is_name(v jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN jsonb_typeof(v) IS DISTINCT FROM 'string' THEN false
                ELSE length(v #>> '{}') BETWEEN 1 AND 64 AND (v #>> '{}') ~ '^[A-Za-z][A-Za-z0-9_.:-]*$' END
$$;

CREATE OR REPLACE FUNCTION pgjobq.cluster_is_int(v jsonb, lo numeric, hi numeric) RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN jsonb_typeof(v) IS DISTINCT FROM 'number' THEN false
                ELSE (v #>> '{}')::numeric BETWEEN lo AND hi AND (v #>> '{}')::numeric = trunc((v #>> '{}')::numeric) END
$$;

-- cluster_set(map, self): installs the map (cluster_map_why says what a map is) in this database, or
-- replaces the one it has, and returns it as cluster_map() does.  self is this database's name among
-- the map's shards; NULL only in a router (a database without pgjobq.jobs).  22023 (invalid_parameter_value)
-- for a map it refuses, naming why; nothing is changed then.  Against the map installed: the epoch must
-- grow, and the cluster's name, self, the number of a shard that stays and the id floor (which must not
-- go down) are kept.  In a shard, the first map also
--   - sets the shard's ids: the jobs' sequence steps by 1024 from the first id above the map's id_floor
--     that ends in the shard's number (id % 1024 = number), so that a job's id names its shard and no
--     two shards hand out the same id; ids stay increasing on each shard (they order a priority's jobs
--     in a claim), and reserve_ids and COPY take theirs from the same sequence.  The ids this database
--     handed out before must all be at most the map's id_floor (else it is refused, naming the highest),
--     so that no other shard's new ids meet them;
--   - installs the guard, the statement trigger jobs_cluster_guard (cluster_guard, below), when the map
--     gives a partition to another shard; a map that gives this shard every partition drops it.
-- Both wait at most 10 seconds for the locks they need (lock_timeout: 55P03), rather than holding up the
-- claims behind them: the ids' with the first map, the guard's when it comes or goes.
CREATE OR REPLACE FUNCTION pgjobq.cluster_set(map jsonb, self text) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '10s'
AS $$
DECLARE
    v_why    text := pgjobq.cluster_map_why(map);
    v_old    pgjobq.cluster;
    v_p      integer;
    v_floor  bigint := coalesce((map ->> 'id_floor')::numeric, 0)::bigint;
    v_shard  boolean := to_regclass('pgjobq.jobs') IS NOT NULL;
    v_number integer;
    v_seq    regclass;
    v_inc    bigint;
    v_start  bigint;
    v_last   bigint;
    v_next   bigint;
    v_guard  boolean;
BEGIN
    IF v_why IS NOT NULL THEN
        RAISE EXCEPTION 'pgjobq.cluster_set: %', v_why USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_p := coalesce((map ->> 'partitions')::integer, 64);
    IF v_shard AND (self IS NULL OR NOT (map -> 'shards') ? self) THEN
        RAISE EXCEPTION 'pgjobq.cluster_set: this database is a shard (it has jobs): self must name one of the map''s shards, not %',
            coalesce('"' || self || '"', 'NULL') USING ERRCODE = 'invalid_parameter_value';
    ELSIF NOT v_shard AND self IS NOT NULL THEN
        RAISE EXCEPTION 'pgjobq.cluster_set: this database has no jobs (a router): self must be NULL'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- One map change at a time: the epoch read here is the one replaced.
    LOCK TABLE pgjobq.cluster IN EXCLUSIVE MODE;
    SELECT * INTO v_old FROM pgjobq.cluster;
    IF FOUND THEN
        v_why := CASE
            WHEN v_old.name <> (map ->> 'name')
              THEN format('this database is in cluster "%s", not "%s"', v_old.name, map ->> 'name')
            WHEN v_old.epoch >= (map ->> 'epoch')::integer
              THEN format('the epoch must grow: this database has the map of epoch %s', v_old.epoch)
            WHEN v_old.self IS DISTINCT FROM self
              THEN format('this database is shard "%s" of the cluster, not "%s"', v_old.self, self)
            WHEN v_old.id_floor > v_floor
              THEN format('the id floor must not go down: it is %s', v_old.id_floor)
        END;
        IF v_why IS NULL THEN
            SELECT format('shard "%s" has number %s (the job ids it handed out end in it), not %s', s.name, s.number,
                          map -> 'shards' -> s.name -> 'number')
              INTO v_why FROM pgjobq.cluster_shards s
             WHERE (map -> 'shards') ? s.name AND (map -> 'shards' -> s.name ->> 'number')::integer <> s.number
             ORDER BY s.name LIMIT 1;
        END IF;
        IF v_why IS NOT NULL THEN
            RAISE EXCEPTION 'pgjobq.cluster_set: %', v_why USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;

    -- The shard's ids (see above), set with the first map.
    IF v_shard THEN
        v_number := (map -> 'shards' -> self ->> 'number')::integer;
        v_seq := pg_get_serial_sequence('pgjobq.jobs', 'id')::regclass;
        SELECT s.seqincrement, s.seqstart INTO v_inc, v_start FROM pg_sequence s WHERE s.seqrelid = v_seq;
        IF v_inc = 1024 AND v_start % 1024 <> v_number THEN
            RAISE EXCEPTION 'pgjobq.cluster_set: this database''s job ids end in %, not in shard "%"''s number %',
                v_start % 1024, self, v_number USING ERRCODE = 'invalid_parameter_value';
        ELSIF v_inc <> 1024 THEN
            -- The ALTER takes the sequence's lock first: no id is handed out until this commits.
            EXECUTE format('ALTER SEQUENCE %s INCREMENT BY 1024', v_seq);
            EXECUTE format('SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END FROM %s s', v_seq)
               INTO v_last;
            v_last := greatest(v_last, (SELECT max(j.id) FROM pgjobq.jobs j), (SELECT max(h.id) FROM pgjobq.history h), 0);
            IF v_last > v_floor THEN
                RAISE EXCEPTION 'pgjobq.cluster_set: this database has handed out job ids up to %: the map''s id_floor (%) must be at least that, so that no shard''s new ids meet them',
                    v_last, v_floor USING ERRCODE = 'invalid_parameter_value';
            END IF;
            -- The first id above the floor that ends in the shard's number.
            v_next := v_floor + 1 + ((v_number - (v_floor + 1) % 1024) + 1024) % 1024;
            EXECUTE format('ALTER SEQUENCE %s START WITH %s RESTART WITH %s', v_seq, v_next, v_next);
        END IF;
    END IF;

    DELETE FROM pgjobq.cluster_owners;
    DELETE FROM pgjobq.cluster_queues;
    DELETE FROM pgjobq.cluster_shards;
    INSERT INTO pgjobq.cluster_shards (name, number, conninfo)
    SELECT s.k, (s.v ->> 'number')::integer, s.v ->> 'conninfo' FROM jsonb_each(map -> 'shards') AS s(k, v);
    INSERT INTO pgjobq.cluster_owners (partition, shard)
    SELECT (o.i - 1)::integer, o.v #>> '{}' FROM jsonb_array_elements(map -> 'owners') WITH ORDINALITY AS o(v, i);
    INSERT INTO pgjobq.cluster_queues (queue, placement, partition)
    SELECT q.k, q.v ->> 'placement', (q.v ->> 'partition')::integer FROM jsonb_each(coalesce(map -> 'queues', '{}')) AS q(k, v);
    INSERT INTO pgjobq.cluster (one, name, epoch, partitions, id_floor, self, installed_at)
    VALUES (true, map ->> 'name', (map ->> 'epoch')::integer, v_p, v_floor, cluster_set.self, now())
    ON CONFLICT (one) DO UPDATE SET epoch = EXCLUDED.epoch, partitions = EXCLUDED.partitions,
                                    id_floor = EXCLUDED.id_floor, installed_at = EXCLUDED.installed_at;

    -- The guard, there while the map gives a partition to another shard: a shard that owns them all
    -- (a cluster of one shard, or a shard before the first move) has nothing to refuse and no trigger,
    -- and pays nothing, as a database in no cluster.  (Nested: the name pgjobq.jobs is looked up when
    -- the statement is planned, which a router cannot.)
    IF v_shard THEN
        v_guard := EXISTS (SELECT FROM pgjobq.cluster_owners o WHERE o.shard <> cluster_set.self);
        IF v_guard AND NOT EXISTS (SELECT FROM pg_trigger t WHERE t.tgrelid = 'pgjobq.jobs'::regclass
                                                              AND t.tgname = 'jobs_cluster_guard') THEN
            CREATE TRIGGER jobs_cluster_guard AFTER INSERT ON pgjobq.jobs REFERENCING NEW TABLE AS new_jobs
                FOR EACH STATEMENT EXECUTE FUNCTION pgjobq.cluster_guard();
        ELSIF NOT v_guard THEN
            DROP TRIGGER IF EXISTS jobs_cluster_guard ON pgjobq.jobs;
        END IF;
    END IF;
    RETURN pgjobq.cluster_map();
END
$$;

-- cluster_guard(): the shard's guard, run by the trigger jobs_cluster_guard after every statement that
-- inserts jobs (enqueue, enqueue_many, enqueue_graph, COPY, a retry from the history, a schedule's
-- tick): when one of the new jobs lives on a partition (route_partition's rule) that the map gives to
-- another shard, the statement fails with SQLSTATE PJQ01, naming the job's queue, its partition, its
-- owner and the map's epoch, and nothing of it is written.  The client that routed it had an older map:
-- it reads the map again (cluster_map()) and routes again.  A statement of one queue whose jobs all
-- live on the queue's partition (a pinned queue, or jobs without a key: nearly every statement) costs
-- one pass over its rows and three indexed reads; otherwise the partitions are computed once per
-- distinct queue (pinned) or routing key (spread).  The outbox's queue (outbox.sql) is this database's
-- whatever the map says of its name, and a dead letter stays where its job failed.
CREATE OR REPLACE FUNCTION pgjobq.cluster_guard() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_first text;
    v_last  text;
    v_keys  boolean;
    v_place text;
    v_pin   integer;
    v_c     pgjobq.cluster;
    v_part  integer;
    v_owner text;
    v_bad   boolean := false;
BEGIN
    SELECT min(j.queue), max(j.queue), bool_or(j.route_key IS NOT NULL) INTO v_first, v_last, v_keys FROM new_jobs j;
    IF v_first IS NULL OR v_first = v_last AND v_first = pgjobq.outbox_queue() THEN
        RETURN NULL;  -- (the outbox's jobs never leave their database: outbox.sql)
    END IF;
    SELECT * INTO v_c FROM pgjobq.cluster;
    IF v_first = v_last THEN
        SELECT q.placement, q.partition INTO v_place, v_pin FROM pgjobq.cluster_queues q WHERE q.queue = v_first;
        IF v_place IS DISTINCT FROM 'spread' OR NOT v_keys THEN
            v_part := coalesce(v_pin, pgjobq.route_hash(v_first) & (v_c.partitions - 1));
            SELECT o.shard INTO v_owner FROM pgjobq.cluster_owners o WHERE o.partition = v_part;
            v_bad := v_owner IS DISTINCT FROM v_c.self;
        END IF;
    END IF;
    IF NOT v_bad AND (v_first <> v_last OR v_place = 'spread' AND v_keys) THEN
        SELECT n.queue, n.part, o.shard INTO v_first, v_part, v_owner
          FROM (SELECT x.queue,
                       CASE WHEN x.key IS NOT NULL THEN pgjobq.route_hash(x.key) & (v_c.partitions - 1)
                            ELSE coalesce(x.pinned_to, pgjobq.route_hash(x.queue) & (v_c.partitions - 1)) END AS part
                  FROM (SELECT DISTINCT j.queue::text AS queue,
                               CASE WHEN q.placement = 'spread' THEN j.route_key::text END AS key,
                               q.partition AS pinned_to
                          FROM new_jobs j LEFT JOIN pgjobq.cluster_queues q ON q.queue = j.queue) x) n
          LEFT JOIN pgjobq.cluster_owners o ON o.partition = n.part
         WHERE o.shard IS DISTINCT FROM v_c.self AND n.queue <> pgjobq.outbox_queue()
         LIMIT 1;
        v_bad := FOUND;
    END IF;
    -- Dead letters (dead_letter_send: a statement of dead letters only, linked in the same statement)
    -- stay on the shard of the job that failed, in its transaction, wherever their queue lives: a
    -- failure, or a rescue, is never refused for its copy (docs/shards.md).  Asked only when refusing.
    IF v_bad AND NOT EXISTS (SELECT FROM new_jobs j WHERE NOT EXISTS (SELECT FROM pgjobq.dead_letters d
                                                                       WHERE d.id = j.id)) THEN
        RETURN NULL;
    END IF;
    IF v_bad THEN
        RAISE EXCEPTION 'pgjobq: a job of queue "%" is of partition %, which shard "%" owns in the map of epoch %, not this shard ("%"): read the map again and route again',
            v_first, v_part, v_owner, v_c.epoch, v_c.self
            USING ERRCODE = 'PJQ01';
    END IF;
    RETURN NULL;
END
$$;
