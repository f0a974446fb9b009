"""pytest for the pgjobq package, against a real PostgreSQL with the pgjobq schema.

    PGJOBQ_TEST_DATABASE_URL=... PGJOBQ_CLI=build/pgjobq /usr/bin/python3 -m pytest -q -x python/tests

`make check` runs this through tests/test_python.c, which sets both (the harness's throwaway server,
a database of the test's own).  Every test uses queues of its own, so they do not see each other's
jobs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Callable, Dict, Iterator, List, Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)
sys.path.insert(0, PYDIR)  # the package from the source tree, not an installed one

URL = os.environ.get("PGJOBQ_TEST_DATABASE_URL", "")
CLI = os.environ.get("PGJOBQ_CLI", "")


def pytest_configure(config: pytest.Config) -> None:
    if not URL:
        raise pytest.UsageError("PGJOBQ_TEST_DATABASE_URL is not set: these tests need a real PostgreSQL with the "
                                "pgjobq schema (make check TESTS_ARGS=python sets it)")


@pytest.fixture
def url() -> str:
    return URL


@pytest.fixture
def queue() -> str:
    return "py" + uuid.uuid4().hex[:12]


@pytest.fixture
def pg() -> Iterator["object"]:
    import psycopg

    with psycopg.connect(URL, autocommit=True) as c:
        yield c


def scalar(sql: str, *params: object) -> object:
    import psycopg

    with psycopg.connect(URL, autocommit=True) as c:
        row = c.execute(sql, params).fetchone()
        return row[0] if row else None


def wait_until(cond: Callable[[], object], timeout: float, what: str, log: str = "") -> object:
    deadline = time.monotonic() + timeout
    pause = 0.01
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            extra = ""
            if log and os.path.exists(log):
                with open(log) as f:
                    extra = "\nworker log (end):\n" + "".join(f.readlines()[-30:])
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{extra}")
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


class Worker:
    """`python3 -m pgjobq worker APP` (which becomes `pgjobq work --coproc ...`), stopped by its pid.
    env: variables to set (None: to remove) over the test's, where PGJOBQ_DATABASE_URL is the test
    database's."""

    def __init__(self, args: List[str], log: str, app: str = "py_tasks:app",
                 env: Optional[Dict[str, Optional[str]]] = None) -> None:
        if not CLI:
            raise pytest.UsageError("PGJOBQ_CLI is not set (the pgjobq command; make check sets it)")
        environ = dict(os.environ)
        environ["PYTHONPATH"] = os.pathsep.join([PYDIR, HERE])
        environ["PGJOBQ_DATABASE_URL"] = URL
        environ["PYTHONDONTWRITEBYTECODE"] = "1"
        for k, v in (env or {}).items():
            if v is None:
                environ.pop(k, None)
            else:
                environ[k] = v
        self.log = log
        self.out = open(log, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "pgjobq", "worker", app, "--pgjobq", CLI] + args,
                                     env=environ, stdout=self.out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=HERE)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # this pid only: the worker we started
                self.proc.wait(10)
        self.out.close()
        return self.proc.returncode


@pytest.fixture
def start_worker(tmp_path) -> Iterator[Callable[..., Worker]]:  # type: ignore[no-untyped-def]
    started: List[Worker] = []

    def start(*args: str, app: str = "py_tasks:app", env: Optional[Dict[str, Optional[str]]] = None) -> Worker:
        w = Worker(list(args), str(tmp_path / f"worker{len(started)}.log"), app, env)
        started.append(w)
        return w

    yield start
    for w in started:
        rc = w.stop()
        if rc != 0:  # SIGTERM drains the worker, which then exits 0
            with open(w.log) as f:
                tail = "".join(f.readlines()[-30:])
            raise AssertionError(f"the worker (pid {w.pid}) exited with {rc} after SIGTERM:\n{tail}")
