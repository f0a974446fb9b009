"""``python3 -m pgjobq worker MODULE:APP``: the pgjobq worker (the C engine) running an App's tasks.

It imports the App (to learn its queues, timeouts and schedules), writes the App's schedules
(``App.sync_schedules``), then replaces itself with

    pgjobq work --coproc "PYTHON -m pgjobq.coproc MODULE:APP --threads N" --queue Q:N ... [-- options]

so that the process you started *is* the worker: SIGTERM drains it, its exit status is the
worker's.  The engine claims, leases, heartbeats, times out, retries and fences; Python only runs
the tasks.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import shutil
import subprocess
import sys
from typing import List, Optional, Tuple

from ._engine import engine_defaults
from ._runner import load_app
from ._sql import default_url
from .app import App
from .errors import PgjobqError

DEFAULT_CONCURRENCY = 10


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


def database_url(pgjobq: str, db: Optional[str]) -> str:
    """The URL the worker will use: --db, $PGJOBQ_DATABASE_URL, $DATABASE_URL, else the embedded
    database's (``pgjobq db url``)."""
    url = db or os.environ.get("PGJOBQ_DATABASE_URL") or os.environ.get("DATABASE_URL")
    if url:
        return url
    r = subprocess.run([pgjobq, "db", "url"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise SystemExit(f"pgjobq worker: no database configured and `pgjobq db url` failed: {r.stderr.strip()}")
    return r.stdout.strip()


def build_command(args: argparse.Namespace, app: App, pgjobq: str, extra: List[str]) -> List[str]:
    queues = _queues(app, args.queue)
    k = max(1, args.coprocs)
    slots = sum(n for _, n in queues)
    threads = args.threads or max(1, math.ceil(slots / k))
    coproc = " ".join(shlex.quote(x) for x in
                      [sys.executable, "-m", "pgjobq.coproc", args.app, "--threads", str(threads)])
    cmd = [pgjobq, "work", "--coproc", coproc]
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
                    help="the database (default: $PGJOBQ_DATABASE_URL, $DATABASE_URL, the embedded one)")
    ap.add_argument("--pgjobq", metavar="PATH", help="the pgjobq command (default: $PGJOBQ_BIN, else PATH)")
    ap.add_argument("--no-sync-schedules", action="store_true",
                    help="do not write the App's @app.periodic schedules at start")
    ap.add_argument("--print-command", action="store_true", help="print the pgjobq work command and exit")
    ap.add_argument("--burst", action="store_true",
                    help="run what is due, then exit 0 once nothing due is left (tests; pgjobq work --burst)")
    ap.add_argument("--reload", action="store_true",
                    help="development: start the worker again when a module file of the App changes (running "
                         "jobs finish first; no attempt is lost)")
    args = ap.parse_args(argv)
    if args.burst and args.reload:
        ap.error("--burst and --reload do not go together")

    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    app = load_app(args.app)
    pgjobq = find_pgjobq(args.pgjobq)
    cmd = build_command(args, app, pgjobq, extra)
    if args.print_command:
        print(shlex.join(cmd))
        return 0

    env = dict(os.environ)
    if args.db:
        # Not on the command line, where ps shows it; a SQLAlchemy URL's +driver is for SQLAlchemy only.
        env["PGJOBQ_DATABASE_URL"] = default_url(args.db)
    if (app.periodics or app.name) and not args.no_sync_schedules:
        url = database_url(pgjobq, args.db)
        try:
            n = app.sync_schedules(url)
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
    if args.reload:
        from ._reload import run as run_reloading

        return run_reloading(cmd, env, args.app)
    os.execve(cmd[0], cmd, env)
    return 127  # not reached
