"""The worker's defaults come from the C library (``pgjobq work --print-defaults``), their one
source; the package's worker must say the same."""

from __future__ import annotations

import pytest

from conftest import CLI
from pgjobq import _engine, worker
from pgjobq.errors import PgjobqError


def test_the_engines_defaults_are_the_librarys():
    d = _engine.engine_defaults(CLI)
    assert set(d) == set(_engine.KEYS) and 0 < d["timeout_ms"] < d["lease_ms"] and d["concurrency"] >= 1
    # What python3 -m pgjobq worker assumes of the engine is what the engine says: its default
    # concurrency (shown in its --help before it knows which pgjobq it runs), and its copy of the job
    # timeout for as long as it keeps one rather than asking engine_defaults.
    assert worker.DEFAULT_CONCURRENCY == d["concurrency"]
    assert getattr(worker, "ENGINE_DEFAULT_TIMEOUT", d["timeout_ms"] / 1000) == d["timeout_ms"] / 1000


def test_a_command_that_cannot_say_is_an_error(tmp_path):
    fake = tmp_path / "pgjobq"
    fake.write_text("#!/bin/sh\necho \"pgjobq work: unknown option '--print-defaults'\" >&2\nexit 64\n")
    fake.chmod(0o755)
    with pytest.raises(PgjobqError, match="unknown option"):
        _engine.engine_defaults(str(fake))
