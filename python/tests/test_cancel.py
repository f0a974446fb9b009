"""A cancel reaches a running task at once, not at its worker's next heartbeat (issue 37, point 8):
the worker holding the job is notified, renews its leases then, and that heartbeat ends the job
cancelled and tells the task; the job says when the cancel was requested and when the task was told."""

import os
import subprocess

import py_tasks
from conftest import CLI, URL, wait_until


def test_a_cancel_reaches_the_task_well_before_a_20_s_heartbeat(start_worker, queue, tmp_path):
    d = str(tmp_path)
    w = start_worker("--queue", f"{queue}:2", "--", "--lease", "60s", "--heartbeat", "20s", "--log-level", "warn")
    job = py_tasks.until_told.configure(queue=queue).defer(URL, d=d)
    wait_until(lambda: os.path.exists(os.path.join(d, "started")), 30, "the task to start", w.log)
    assert py_tasks.app.cancel(job.id, conn=URL) == "cancel_requested"
    # Told within 10 s (milliseconds in practice); the heartbeat alone would take up to 20 s.
    wait_until(lambda: os.path.exists(os.path.join(d, "told")), 10, "the task to be told", w.log)
    info = py_tasks.app.get(job.id, conn=URL)
    assert info.state == "cancelled" and info.cancel_requested
    assert info.cancel_requested_at is not None and info.cancel_told_at is not None
    assert info.cancel_requested_at <= info.cancel_told_at, info
    out = subprocess.run([CLI, "--db", URL, "show", str(job.id)], stdout=subprocess.PIPE, text=True).stdout
    assert "cancel:        requested " in out and "; its handler told " in out, out
