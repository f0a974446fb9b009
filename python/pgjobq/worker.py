"""``python3 -m pgjobq worker MODULE:APP``: the pgjobq worker (the C engine) running an App's tasks.

It imports the App (to learn its queues, timeouts and schedules: a module that cannot be imported
stops it here, with its traceback and exit status 78, before anything is claimed), writes the App's
schedules (``App.sync_schedules``, waiting for a database that is down as the engine would), then
replaces itself with

    pgjobq work --keep-env --coproc "PYTHON -m pgjobq.coproc MODULE:APP --threads N" --queue Q:N ...
        [-- options]

so that the process you started *is* the worker: SIGTERM drains it, its exit status is the
worker's.  The engine claims, leases, heartbeats, times out, retries and fences; Python only runs
the tasks, in the environment the worker was started with (``--keep-env``), with
``$PGJOBQ_DATABASE_URL`` set to the worker's database so that a task's ``defer()`` and ``app.get()``
need nothing more.  A cluster of shards (``--cluster``, the App's ``cluster``, ``$PGJOBQ_CLUSTER``)
goes to ``pgjobq work`` and to the tasks as ``$PGJOBQ_CLUSTER`` (not on the command line, where ps
shows it): the engine serves the shards, and a task's ``defer()`` routes each job to its shard.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, List, Optional, Tuple

from ._cluster import ENV as CLUSTER_ENV
from ._engine import engine_defaults
from ._runner import load_app_or_exit
from ._sql import configured_url, libpq_url, unreachable
from ._util import redact, seconds
from .app import App
from .errors import InvalidArgument, PgjobqError

DEFAULT_CONCURRENCY = 10


def _duration(text: str) -> float:
    try:
        return seconds(text, "--unknown-kind-delay")
    except InvalidArgument as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def find_pgjobq(given: Optional[str]) -> str:
    for candidate in (given, os.environ.get("PGJOBQ_BIN")):
        if candidate:
            path = shutil.which(candidate) if os.sep not in candidate else candidate
            if path and os.access(path, os.X_OK):
                return path
            raise SystemExit(f"pgjobq worker: {candidate} is not an executable pgjobq command")
    path = shutil.which("pgjobq")
    if path is None:
        raise SystemExit("pgjobq worker: cannot find the pgjobq command: put it on PATH, give --pgjobq PATH "
                         "or set $PGJOBQ_BIN")
    return path


def _queues(app: App, given: Optional[List[str]]) -> List[Tuple[str, int]]:
    out: List[Tuple[str, int]] = []
    if given:
        for q in given:
            name, _, n = q.partition(":")
            try:
                conc = int(n) if n else DEFAULT_CONCURRENCY
            except ValueError:
                raise SystemExit(f"pgjobq worker: --queue {q}: the concurrency must be a number") from None
            if conc < 1:
                raise SystemExit(f"pgjobq worker: --queue {q}: the concurrency must be at least 1")
            out.append((name, conc))
        return out
    names = sorted({t.queue or app.queue for t in app.tasks.values()} or {app.queue})
    return [(n, DEFAULT_CONCURRENCY) for n in names]


def _has_option(args: List[str], *names: str) -> bool:
    return any(a == n or a.startswith(n + "=") for a in args for n in names)


def database_url(pgjobq: str, db: Any, app: Optional[App] = None, cluster: Optional[str] = None) -> Optional[str]:
    """The URL the worker will use, as libpq reads it: --db, the App's ``database_url``,
    $PGJOBQ_DATABASE_URL, $DATABASE_URL (SQLAlchemy's forms too), else the embedded database's
    (``pgjobq db url``); in a cluster, none but those given (the cluster names the shards)."""
    url = db or (app.database_url if app is not None else None) or configured_url()
    if url:
        return libpq_url(url)
    if cluster:
        return None
    r = subprocess.run([pgjobq, "db", "url"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise SystemExit(f"pgjobq worker: no database configured and `pgjobq db url` failed: {r.stderr.strip()}")
    return r.stdout.strip()


def sync_schedules_when_reachable(app: App, url: Optional[str]) -> int:
    """App.sync_schedules, waiting (as the engine does: a line each try, 1 s doubling to 30 s) while
    the database cannot be reached; SIGTERM or SIGINT meanwhile exits 0, as the engine does when
    stopped before it started."""
    pause = 1.0
    while True:
        try:
            return app.sync_schedules(url)
        except Exception as e:  # noqa: BLE001 - only the database being out of reach is waited for
            if not unreachable(e):
                raise
            why = redact(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
        print(f"pgjobq worker: cannot reach the database to write the App's schedules ({why}); "
              f"trying again in {pause:g} s", file=sys.stderr, flush=True)
        time.sleep(pause)
        pause = min(pause * 2, 30.0)


def _stop_quietly(signum: int, frame: Any) -> None:
    raise SystemExit(0)  # stopped before the worker started: nothing claimed, nothing lost


def build_command(args: argparse.Namespace, app: App, pgjobq: str, extra: List[str]) -> List[str]:
    queues = _queues(app, args.queue)
    k = max(1, args.coprocs)
    slots = sum(n for _, n in queues)
    threads = args.threads or max(1, math.ceil(slots / k))
    coproc = " ".join(shlex.quote(x) for x in
                      [sys.executable, "-m", "pgjobq.coproc", args.app, "--threads", str(threads)])
    if args.fail_unknown_kinds:
        coproc += " --fail-unknown-kinds"
    elif args.unknown_kind_delay is not None:
        coproc += f" --unknown-kind-delay {args.unknown_kind_delay:g}"
    # The tasks are the application's own code, started from its own command line: they get the
    # environment it was started with (its settings, its DATABASE_URL), which `pgjobq work` keeps from
    # a handler unless told.
    cmd = [pgjobq, "work", "--keep-env", "--coproc", coproc]
    if k > 1:
        cmd += ["--coprocs", str(k)]
    for name, n in queues:
        cmd += ["--queue", f"{name}:{n}"]
    # A task's own timeout must come before the engine's (80% of the lease): raise both if needed.
    longest = max((t.timeout for t in app.tasks.values() if t.timeout is not None), default=None)
    engine = engine_defaults(pgjobq) if longest is not None else None
    if engine and longest + 2 > engine["timeout_ms"] / 1000 and not _has_option(extra, "--timeout", "--lease"):
        timeout = math.ceil(longest + 2)
        lease = max(engine["lease_ms"] // 1000, math.ceil(timeout * 1.25))
        cmd += ["--lease", f"{lease}s", "--timeout", f"{timeout}s"]
    if getattr(args, "burst", False):
        cmd.append("--burst")
    return cmd + extra


def main(argv: List[str]) -> int:
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    else:
        extra = []
    ap = argparse.ArgumentParser(
        prog="python3 -m pgjobq worker",
        description="Runs the pgjobq worker (pgjobq work --coproc) on an App's tasks. Options after -- go to "
                    "`pgjobq work` as they are (e.g. -- --lease 2m --log-level warn).")
    ap.add_argument("app", help="MODULE:APP, e.g. myapp.tasks:app")
    ap.add_argument("--queue", "-q", action="append", metavar="QUEUE[:N]",
                    help="serve QUEUE with N jobs at a time (repeatable; default: every queue of the App's tasks, "
                         f"{DEFAULT_CONCURRENCY} each)")
    ap.add_argument("--coprocs", type=int, default=1, metavar="K",
                    help="Python processes running tasks, each taking its share of the slots (default 1)")
    ap.add_argument("--threads", type=int, metavar="N",
                    help="threads for sync tasks in each process (default: its share of the slots)")
    ap.add_argument("--db", metavar="URL",
                    help="the database (default: the App's database_url, $PGJOBQ_DATABASE_URL, $DATABASE_URL, the "
                         "embedded one; SQLAlchemy's URL forms too)")
    ap.add_argument("--cluster", metavar="SPEC",
                    help="a cluster of shards: a conninfo or URL of any shard or of the router, or a JSON map "
                         "file (default: the App's cluster, $PGJOBQ_CLUSTER); given to pgjobq work and to the "
                         "tasks as $PGJOBQ_CLUSTER")
    ap.add_argument("--pgjobq", metavar="PATH", help="the pgjobq command (default: $PGJOBQ_BIN, else PATH)")
    ap.add_argument("--no-sync-schedules", action="store_true",
                    help="do not write the App's @app.periodic schedules at start")
    ap.add_argument("--fail-unknown-kinds", action="store_true",
                    help="fail for good a job whose kind the App has no task for (default: hand it back "
                         "untouched, no attempt used, to run after --unknown-kind-delay: a worker of a newer "
                         "release may know it)")
    ap.add_argument("--unknown-kind-delay", metavar="DURATION", type=_duration,
                    help="how long a job of a kind the App does not know waits before it runs again "
                         "(default 60s)")
    ap.add_argument("--print-command", action="store_true", help="print the pgjobq work command and exit")
    ap.add_argument("--burst", action="store_true",
                    help="run what is due, then exit 0 once nothing due is left (tests; pgjobq work --burst)")
    ap.add_argument("--reload", action="store_true",
                    help="development: start the worker again when a module file of the App changes (running "
                         "jobs finish first; no attempt is lost)")
    args = ap.parse_args(argv)
    if args.burst and args.reload:
        ap.error("--burst and --reload do not go together")

    # SIGTERM or SIGINT before the engine runs (while the App is imported, or the database is down)
    # stops it with status 0, as it stops the engine before it started.
    signal.signal(signal.SIGTERM, _stop_quietly)
    signal.signal(signal.SIGINT, _stop_quietly)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    app = load_app_or_exit(args.app, "pgjobq worker")
    pgjobq = find_pgjobq(args.pgjobq)
    cmd = build_command(args, app, pgjobq, extra)
    cluster = args.cluster or app.cluster or os.environ.get(CLUSTER_ENV) or None
    if args.print_command:
        print((f"{CLUSTER_ENV}={shlex.quote(redact(cluster))} " if cluster else "") + shlex.join(cmd))
        return 0

    env = dict(os.environ)
    # The engine's database, and the App's in the tasks unless it names one: not on the command line,
    # where ps shows it, and as libpq reads it (a SQLAlchemy URL's +driver is for SQLAlchemy only).
    # Likewise the cluster, for the engine and for the tasks' defer() (and this process's schedules).
    url = database_url(pgjobq, args.db, app, cluster)
    if url is not None:
        env["PGJOBQ_DATABASE_URL"] = url
    if cluster:
        env[CLUSTER_ENV] = os.environ[CLUSTER_ENV] = cluster
    if (app.periodics or app.name) and not args.no_sync_schedules:
        try:
            n = sync_schedules_when_reachable(app, None if cluster else url)
        except PgjobqError as e:
            print(f"pgjobq worker: could not write the App's schedules ({e}); going on without "
                  "(run with a role that has pgjobq_admin, or --no-sync-schedules)", file=sys.stderr)
        else:
            if n:
                print(f"pgjobq worker: schedules: {n} created, changed or deleted", file=sys.stderr)
    # The coprocess imports this package and the App: the same way this process did.
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = [here, os.getcwd()] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if args.reload:
        from ._reload import run as run_reloading

        return run_reloading(cmd, env, args.app)
    os.execve(cmd[0], cmd, env)
    return 127  # not reached
