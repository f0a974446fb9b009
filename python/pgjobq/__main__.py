"""``python3 -m pgjobq``: worker, sync-schedules."""

from __future__ import annotations

import sys
from typing import List, Optional

USAGE = """usage: python3 -m pgjobq COMMAND ...

  worker MODULE:APP [--queue Q[:N]]... [--coprocs K] [--db URL] [--pgjobq PATH] [--burst | --reload]
         [-- pgjobq work options]
        run the pgjobq worker on the App's tasks (python3 -m pgjobq worker --help)
  sync-schedules MODULE:APP [--db URL]
        write the App's @app.periodic schedules to the database and exit
  version
"""


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0 if args else 64
    cmd, rest = args[0], args[1:]
    if cmd == "worker":
        from .worker import main as worker_main

        return worker_main(rest)
    if cmd == "sync-schedules":
        import argparse
        import os

        from ._runner import load_app

        ap = argparse.ArgumentParser(prog="python3 -m pgjobq sync-schedules")
        ap.add_argument("app")
        ap.add_argument("--db", metavar="URL")
        a = ap.parse_args(rest)
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        n = load_app(a.app).sync_schedules(a.db)
        print(f"{n} schedules created, changed or deleted")
        return 0
    if cmd == "version":
        from . import __version__

        print(__version__)
        return 0
    print(f"python3 -m pgjobq: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr, end="")
    return 64


if __name__ == "__main__":
    sys.exit(main())
