"""The C engine's defaults, as the library states them: ``pgjobq work --print-defaults``.

The worker's lease, heartbeat, job timeout, poll interval, shutdown timeout, claim batch and a
queue's concurrency have one source, the C library (``pgjobq_worker_opts_defaults``,
``PGJOBQ_DEFAULT_CONCURRENCY``); the package asks the pgjobq command it runs rather than stating
them again.
"""

from __future__ import annotations

import functools
import json
import subprocess
from typing import Dict

from .errors import PgjobqError

__all__ = ["engine_defaults"]

KEYS = ("lease_ms", "heartbeat_ms", "timeout_ms", "poll_ms", "shutdown_timeout_ms", "batch_max", "concurrency")


@functools.lru_cache(maxsize=8)
def engine_defaults(pgjobq: str) -> Dict[str, int]:
    """The settings ``pgjobq work`` runs with when given no options, from the command at ``pgjobq``
    (a path): milliseconds for ``lease_ms``, ``heartbeat_ms``, ``timeout_ms``, ``poll_ms`` and
    ``shutdown_timeout_ms``; ``batch_max``; ``concurrency`` (a queue's, when none is given).  Asked
    once per command and process.  A command too old to answer raises PgjobqError."""
    r = subprocess.run([pgjobq, "work", "--print-defaults"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
    try:
        values = json.loads(r.stdout) if r.returncode == 0 else None
    except ValueError:
        values = None
    if not isinstance(values, dict) or any(not isinstance(values.get(k), int) for k in KEYS):
        raise PgjobqError(f"{pgjobq} work --print-defaults did not answer with the worker's defaults "
                          f"(exit {r.returncode}: {r.stderr.strip() or r.stdout.strip()}): is it an older pgjobq?")
    return {k: int(values[k]) for k in KEYS}
