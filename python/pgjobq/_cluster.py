"""A cluster of shards (docs/shards.md, docs/python.md "Shards"): the map, where a job goes, which
shard an id names, and whether a caller's connection is the job's shard.

A *spec* (``App(cluster=...)``, ``$PGJOBQ_CLUSTER``) is a conninfo or URL of any shard or of the
router, whose map ``pgjobq.cluster_map()`` returns, or a JSON map file (a path starting with ``/``,
``./`` or ``../``, or ``file:PATH``).  A database with no map is a cluster of one shard: that
database.  The map is read once per process and spec (at the first call that needs it, not at
import), and again once when a shard refuses a job with SQLSTATE PJQ01 (its map is newer).

Where a job goes is SQL's ``pgjobq.route_partition`` (sql/functions/cluster.sql), computed here:
a spread queue with a routing key: ``route_hash(route_key) & (P - 1)``; any other job: its queue's
partition, the map's, else ``route_hash(queue) & (P - 1)``; the partition's owner is its shard.
``route_hash`` is FNV-1a, 32 bits, over the key's UTF-8 bytes (C: pgjobq__route_hash).
"""

from __future__ import annotations

import json
import os
import threading
import weakref
from typing import Any, Dict, Iterable, List, Optional, Tuple

from . import _sql
from ._util import redact
from .errors import InvalidArgument, InvalidJob, ShardUnavailable, WrongShard

__all__ = ["ENV", "Cluster", "Map", "route_hash", "current", "cluster_for"]

ENV = "PGJOBQ_CLUSTER"
# libpq's connect_timeout for a shard's connections when neither its conninfo nor $PGCONNECT_TIMEOUT
# gives one: a shard that is down fails the calls routed to it within this many seconds, and the
# others go on.
CONNECT_TIMEOUT = 5

_FNV_BASIS = 2166136261
_FNV_PRIME = 16777619


def route_hash(key: str) -> int:
    """FNV-1a, 32 bits, over the key's UTF-8 bytes: SQL's ``pgjobq.route_hash``."""
    h = _FNV_BASIS
    for b in key.encode("utf-8"):
        h = ((h ^ b) * _FNV_PRIME) & 0xFFFFFFFF
    return h


def _is_file(spec: str) -> bool:
    return spec.startswith(("/", "./", "../", "file:"))


def _with_timeout(conninfo: str) -> str:
    """The conninfo with connect_timeout (CONNECT_TIMEOUT) unless it or $PGCONNECT_TIMEOUT has one."""
    if os.environ.get("PGCONNECT_TIMEOUT"):
        return conninfo
    try:
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        if "connect_timeout" in conninfo_to_dict(conninfo):
            return conninfo
        return str(make_conninfo(conninfo, connect_timeout=CONNECT_TIMEOUT))
    except ImportError:
        pass
    try:
        from psycopg2.extensions import make_dsn, parse_dsn

        if "connect_timeout" in parse_dsn(conninfo):
            return conninfo
        return str(make_dsn(conninfo, connect_timeout=CONNECT_TIMEOUT))
    except ImportError:
        return conninfo


class Map:
    """A cluster map as ``pgjobq.cluster_map()`` returns it, read for routing.  ``single``: the
    spec's database has no map (a cluster of one shard, named "")."""

    def __init__(self, doc: Optional[Dict[str, Any]], spec: str, where: str) -> None:
        self.where = where
        if doc is None:
            self.single = True
            self.name: Optional[str] = None
            self.epoch = 0
            self.partitions = 1
            self.id_floor = 0
            self.shards: Dict[str, Tuple[int, str]] = {"": (0, _sql.libpq_url(spec))}
            self.owners = [""]
            self.queues: Dict[str, Tuple[str, Optional[int]]] = {}
        else:
            self.single = False
            self._read(doc)
        self.by_number = {n: s for s, (n, _) in self.shards.items()}
        self.urls = {s: _with_timeout(c) for s, (_, c) in self.shards.items()}

    def _bad(self, why: str) -> InvalidArgument:
        return InvalidArgument(f"pgjobq: the cluster map of {self.where}: {why}")

    def _read(self, doc: Any) -> None:
        if not isinstance(doc, dict):
            raise self._bad("it is not a JSON object")
        try:
            self.name = doc.get("name")
            self.epoch = int(doc.get("epoch") or 0)
            self.partitions = int(doc.get("partitions") or 64)
            self.id_floor = int(doc.get("id_floor") or 0)
            self.shards = {str(k): (int(v["number"]), str(v["conninfo"])) for k, v in dict(doc["shards"]).items()}
            self.owners = [str(o) for o in doc["owners"]]
            self.queues = {str(k): (str(v["placement"]), None if v.get("partition") is None else int(v["partition"]))
                           for k, v in dict(doc.get("queues") or {}).items()}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise self._bad(f"it is not a map ({type(e).__name__}: {e}): see docs/shards.md, \"The map\"") from None
        p = self.partitions
        if p < 1 or p & (p - 1):
            raise self._bad(f'"partitions" is {p}, not a power of two')
        if len(self.owners) != p:
            raise self._bad(f'"owners" has {len(self.owners)} names, not one for each of the {p} partitions')
        unknown = sorted({o for o in self.owners if o not in self.shards})
        if unknown:
            raise self._bad(f'"owners" names {unknown[0]!r}, which is no shard of the map')
        for q, (place, part) in self.queues.items():
            if place not in ("pinned", "spread") or (part is not None and not 0 <= part < p):
                raise self._bad(f"queue {q!r}: {{'placement': {place!r}, 'partition': {part!r}}} is not a placement")

    # -- where a job goes --------------------------------------------------------------------------
    def partition(self, queue: Optional[str], route_key: Optional[str]) -> int:
        """SQL's ``pgjobq.route_partition(queue, route_key)``."""
        q = "default" if queue is None else queue
        place, part = self.queues.get(q, ("pinned", None))
        try:
            if place == "spread" and route_key is not None:
                return route_hash(route_key) & (self.partitions - 1)
            return part if part is not None else route_hash(q) & (self.partitions - 1)
        except UnicodeEncodeError:
            raise InvalidJob(f"the queue {q!r} or the route_key {route_key!r} is not valid text (UTF-8)") from None

    def owner(self, queue: Optional[str], route_key: Optional[str]) -> str:
        """The shard a job of this queue with this routing key lives on."""
        if self.single:
            return ""
        return self.owners[self.partition(queue, route_key)]

    def shard_of_id(self, job_id: int) -> Optional[str]:
        """The shard that handed out a job id (its number is id % 1024), or None when any shard may
        hold it: an id at most the map's id_floor (from before the cluster), or a number no shard
        of the map has."""
        if self.single:
            return ""
        if job_id <= self.id_floor:
            return None
        return self.by_number.get(job_id % 1024)

    def label(self, shard: str) -> str:
        return "the cluster's one database" if self.single else f'shard "{shard}"'


class Cluster:
    """The cluster a spec names: its map, read when first needed and again after a PJQ01."""

    def __init__(self, spec: str) -> None:
        if not isinstance(spec, str) or not spec.strip():
            raise InvalidArgument(f"pgjobq: a cluster is a conninfo, a URL or a map file's path, not {spec!r}")
        self.spec = spec.strip()
        self._map: Optional[Map] = None
        self._lock = threading.Lock()
        # Which shard a caller's connection is (pgjobq.cluster's name and self), read once each.
        self._selves: "weakref.WeakKeyDictionary[Any, Tuple[Optional[str], Optional[str]]]" = weakref.WeakKeyDictionary()
        self._url_selves: Dict[str, Tuple[Optional[str], Optional[str]]] = {}

    def __repr__(self) -> str:
        return f"<pgjobq cluster {redact(self.spec)!r}>"

    @property
    def where(self) -> str:
        return redact(self.spec)

    def map(self) -> Map:
        m = self._map
        if m is None:
            with self._lock:
                if self._map is None:
                    self._map = self._read()
                m = self._map
        return m

    def reload(self, seen: Optional[Map] = None) -> Map:
        """Reads the map again (unless another thread did since ``seen`` was read)."""
        with self._lock:
            if seen is None or self._map is seen:
                self._map = self._read()
            return self._map  # type: ignore[return-value]

    def _read(self) -> Map:
        spec = self.spec
        if _is_file(spec):
            path = spec[5:] if spec.startswith("file:") else spec
            try:
                with open(path, encoding="utf-8") as f:
                    doc = json.load(f)
            except OSError as e:
                raise InvalidArgument(f"pgjobq: cannot read the cluster map file {path}: {e.strerror}") from None
            except ValueError as e:
                raise InvalidArgument(f"pgjobq: the cluster map file {path} is not JSON: {e}") from None
            return Map(doc, spec, path)
        url = _sql.libpq_url(spec)
        try:
            rows = _sql.run(url, "SELECT CAST(pgjobq.cluster_map() AS text)", {})
        except Exception as e:
            if _sql.unreachable(e):
                raise ShardUnavailable(f"pgjobq: cannot read the cluster map: {redact(url)} cannot be reached: "
                                       f"{_first_line(e)}", None) from e
            raise
        text = rows[0][0] if rows else None
        return Map(json.loads(text) if text is not None else None, spec, redact(url))

    # -- shards ---------------------------------------------------------------------------------
    def down(self, m: Map, shard: str, e: BaseException) -> ShardUnavailable:
        return ShardUnavailable(f"pgjobq: {m.label(shard)} of the cluster ({redact(m.shards[shard][1])}) cannot be "
                                f"reached: {_first_line(e)}", shard)

    def on_shard(self, m: Map, shard: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """fn(url of the shard, ...), a shard out of reach raised as ShardUnavailable naming it."""
        try:
            return fn(m.urls[shard], *args, **kwargs)
        except Exception as e:  # (a PgjobqError of class 08 or 57P0x too: the server went away)
            if _sql.unreachable(e):
                raise self.down(m, shard, e) from e
            raise

    async def aon_shard(self, m: Map, shard: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(m.urls[shard], *args, **kwargs)
        except Exception as e:
            if _sql.unreachable(e):
                raise self.down(m, shard, e) from e
            raise

    # -- a caller's connection ----------------------------------------------------------------------
    def self_of(self, target: Any) -> Tuple[Optional[str], Optional[str]]:
        """(cluster name, shard name) of the database a caller's connection, session, engine or URL
        is on, as its pgjobq.cluster says ((None, None): no map there), read once per connection."""
        kind = _sql.classify(target)
        key = _sql.libpq_url(target) if kind == "url" else _conn_key(target, kind)
        got = (self._url_selves if isinstance(key, str) else self._selves).get(key) if key is not None else None
        if got is None:
            rows = _sql.run(target, _SELF_SQL, {})
            got = (rows[0][0], rows[0][1]) if rows else (None, None)
            self._remember(key, got)
        return got

    def _remember(self, key: Any, got: Tuple[Optional[str], Optional[str]]) -> None:
        if isinstance(key, str):
            self._url_selves[key] = got
        elif key is not None:
            try:
                self._selves[key] = got
            except TypeError:  # a connection that takes no weak reference: read each time
                pass

    async def aself_of(self, target: Any) -> Tuple[Optional[str], Optional[str]]:
        kind = _sql.classify(target)
        key = _sql.libpq_url(target) if kind == "url" else target
        got = (self._url_selves if isinstance(key, str) else self._selves).get(key)
        if got is None:
            rows = await _sql.arun(target, _SELF_SQL, {})
            got = (rows[0][0], rows[0][1]) if rows else (None, None)
            self._remember(key, got)
        return got

    def owners_of(self, m: Map, specs: Iterable[Any]) -> List[str]:
        return [m.owner(s.queue, s.route_key) for s in specs]

    def check_here(self, target: Any, specs: List[Any], here: Tuple[Optional[str], Optional[str]]) -> None:
        """Refuses (WrongShard) jobs that the map puts on another shard than the caller's connection's:
        written there they would be refused by that shard's guard, or, in a database out of the
        cluster, be lost to it.  The map is read again once first (the connection's may be newer)."""
        m = self.map()
        if m.single:
            return
        name, me = here
        if name is not None and name != m.name:
            m = self.reload(m)
            if name != m.name:
                raise WrongShard(f'pgjobq: this connection is to shard "{me}" of cluster "{name}", not to a shard '
                                 f'of cluster "{m.name}" ({self.where}): nothing was enqueued', None, None, me)
        owners = self.owners_of(m, specs)
        wrong = [i for i, o in enumerate(owners) if o != me]
        if wrong:
            m = self.reload(m)
            owners = self.owners_of(m, specs)
            wrong = [i for i, o in enumerate(owners) if o != me]
        if not wrong:
            return
        i = wrong[0]
        s = specs[i]
        job = f"job {i} of the call" if len(specs) > 1 else "the job"
        where = (f'shard "{me}"' if me is not None
                 else "a database that is no shard of the cluster (it has no map: pgjobq.cluster_set installs one)")
        raise WrongShard(
            f'pgjobq: {job} (queue "{s.queue or "default"}"'
            + (f', route_key "{s.route_key}"' if s.route_key is not None else "")
            + f') lives on shard "{owners[i]}" (partition {m.partition(s.queue, s.route_key)} in the map of epoch '
            f"{m.epoch}), but this connection is to {where}: a job enqueued in your transaction must live on the "
            f'shard of your connection; nothing was enqueued. Enqueue it on a connection to shard "{owners[i]}", or '
            "without a connection (committed at once on its shard), or give it a route_key of this shard",
            None, owners[i], me)

    def stale(self, e: WrongShard, m: Optional[Map] = None) -> WrongShard:
        """A PJQ01 from a shard's guard in a caller's transaction: the map is read again for the next
        call, and the error says the transaction is to be run again."""
        try:
            self.reload(m)
        except Exception:  # noqa: BLE001 - the PJQ01 is the error to report
            pass
        return WrongShard(f"{e.message}. The cluster's map ({self.where}) was read again: run it again (a "
                          "transaction of yours it ran in is aborted: roll it back, and run the transaction again)",
                          e.sqlstate, e.shard, e.connection_shard)


_SELF_SQL = "SELECT CAST(c.name AS text), CAST(c.self AS text) FROM pgjobq.cluster c"


def _conn_key(target: Any, kind: str) -> Any:
    """The object to remember a caller's connection by: the DB-API connection under it (a pooled one
    stays on its database), or the Engine."""
    if kind == "sa_engine":
        return target
    try:
        from ._txn import _dbapi

        if kind == "sa_session":
            orm = __import__("sys").modules.get("sqlalchemy.orm")
            if orm is not None and isinstance(target, orm.scoped_session):
                target = target.registry()
        return _dbapi(target, kind)
    except Exception:  # noqa: BLE001 - not remembered: read each time
        return None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return redact(text.splitlines()[0] if text else type(e).__name__)


_clusters: Dict[str, Cluster] = {}
_clusters_lock = threading.Lock()


def cluster_for(spec: str) -> Cluster:
    """The Cluster of a spec, one per process (its map read once)."""
    c = _clusters.get(spec)
    if c is None:
        with _clusters_lock:
            c = _clusters.setdefault(spec, Cluster(spec))
    return c


def current(spec: Optional[str] = None) -> Optional[Cluster]:
    """The cluster of ``spec``, else of $PGJOBQ_CLUSTER (read when called), else None: one database,
    as without a cluster."""
    s = spec or os.environ.get(ENV)
    return cluster_for(s) if s else None
