"""``python3 -m pgjobq.coproc MODULE:APP``: the handler side of ``pgjobq work --coproc`` for an App's
tasks (``python3 -m pgjobq worker`` starts the worker with it).  See pgjobq._runner."""

from ._runner import Runner, describe, load_app, main

__all__ = ["Runner", "describe", "load_app", "main"]

if __name__ == "__main__":
    main()
