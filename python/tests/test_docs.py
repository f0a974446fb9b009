"""docs/python.md's tour and its "Testing your tasks" run as written: each section's sh blocks in
order, in one shell, from the top of the repository, with each python block that starts with
`# FILE.py` saved as that file where it appears."""

import os
import re
import signal
import subprocess
import sys

from conftest import CLI, PYDIR, URL

REPO = os.path.dirname(PYDIR)


def section_blocks(doc: str, title: str, least: int) -> list:
    """The section's sh blocks, and its python blocks that start with `# FILE.py` as commands that
    save them, in order."""
    section = doc.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
    parts = []
    for lang, body in re.findall(r"\n```(\w+)\n(.*?)\n```\n", section, re.S):
        if lang == "sh":
            parts.append(body)
        elif lang == "python":
            m = re.match(r"# (\w+\.py)\n", body)
            assert m, f"a python block of {title} names no file:\n{body[:200]}"
            parts.append(f"cat > {m.group(1)} <<'PGJOBQ_TOUR_EOF'\n{body}\nPGJOBQ_TOUR_EOF")
    assert len(parts) >= least, f"{title} has fewer blocks than expected: was it renamed?"
    return parts


def script_of(parts: list) -> str:
    # If a step fails, the workers it started are stopped all the same.
    return ("set -e\nworker=\nworker2=\n"
            "trap 'for w in $worker $worker2; do kill -TERM \"$w\" 2>/dev/null || true; done' EXIT\n"
            + "\n".join(parts) + "\n")


def tour_script(doc: str) -> str:
    return script_of(section_blocks(doc, "Five-minute tour", 6))


def run_script(script: str, tmp_path) -> str:  # type: ignore[no-untyped-def]
    env = dict(os.environ)
    # Debian's python3 (with psycopg and SQLAlchemy) and the pgjobq command under test come first.
    env["PATH"] = os.pathsep.join([os.path.dirname(CLI), os.path.dirname(sys.executable), env.get("PATH", "")])
    env["PGJOBQ_DATABASE_URL"] = URL
    env["TMPDIR"] = str(tmp_path)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    proc = subprocess.Popen(["bash", "-c", script], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the session this test started, and only that
        out, _ = proc.communicate()
        raise AssertionError(f"the script did not finish in 90 s:\n{out}")
    assert proc.returncode == 0, out
    return out


def test_the_tour_runs_as_written(tmp_path):
    with open(os.path.join(REPO, "docs", "python.md")) as f:
        out = run_script(tour_script(f.read()), tmp_path)
    assert "{'sent': 'ana" in out and "failed: no such domain" in out, out
    assert "{'month': '2026-11', 'attempt': 2}" in out and "queued cancelled" in out, out
    assert "tour:nightly_report" in out, out


def test_testing_your_tasks_runs_as_written(tmp_path):
    with open(os.path.join(REPO, "docs", "python.md")) as f:
        out = run_script(script_of(section_blocks(f.read(), "Testing your tasks", 4)), tmp_path)
    assert "2 passed" in out and "the burst worker is done" in out, out


def test_the_deploying_section_runs_as_written(tmp_path):
    with open(os.path.join(REPO, "docs", "python.md")) as f:
        doc = f.read()
    # After the tour's first block (the command, the package, the database), as the section says.
    first = section_blocks(doc, "Five-minute tour", 6)[0]
    out = run_script(script_of([first] + section_blocks(doc, "Deploying", 7)), tmp_path)
    assert "{'order': 7, 'region': 'eu-west'}" in out, out
    assert "queued 0 no task for the kind 'refund' in this App" in out and "{'refunded': 7}" in out, out
    assert "exit status 78" in out and "No module named 'stripe_sdk_the_release_forgot'" in out, out
    assert "pgjobq worker: cannot import broken_tasks:app" in out, out


def test_the_durable_tour_runs_as_written(tmp_path):
    # docs/durable.md's Python tour, read from the page: the job completes at its second attempt; its
    # steps ran once each (the first attempt stored them and failed, the second did not run them
    # again); its sleep parked it, then its wait, and the event resumed it.
    with open(os.path.join(REPO, "docs", "durable.md")) as f:
        doc = f.read()
    parts = section_blocks(doc, "A tour in Python", 2)
    # Written where the test's files go, not into the source tree; the package under test (the page
    # takes it as installed: docs/python.md).
    out = run_script(script_of([f"cd '{tmp_path}'", f"export PYTHONPATH='{PYDIR}'"] + parts), tmp_path)
    m = re.match(r"job (\d+)\n", out)
    assert m, out
    job_id = int(m.group(1))
    want = ("{'retried': 1, 'parked': 1}\nsleeping\n{'parked': 1}\nwaiting\nresumed 1\n{'completed': 1}\n"
            "{'paid': {'amount': 1200}, 'sent': {'sent_at_attempt': 1}, 'attempt': 2, 'charged': {'charged': 1200}}\n"
            "ran {'charge': 1, 'receipt': 1}\n"
            "steps [('charge', 1), ('receipt', 1), ('cool-off', 2), ('paid', 1)]\n")
    assert out == m.group(0) + want, out
    # What the page says it prints is what it printed (but the job's id).
    shown = doc.split("\n## A tour in Python\n", 1)[1].split("It prints:\n\n```\n", 1)[1].split("\n```\n", 1)[0]
    assert re.sub(r"^job \d+\n", "", shown + "\n") == want, shown
    import psycopg

    with psycopg.connect(URL, autocommit=True) as c:
        assert c.execute("SELECT state, attempt FROM pgjobq.history WHERE id = %s", (job_id,)).fetchone() == (
            "completed", 2)
        assert c.execute("SELECT count(*) FROM charges WHERE job_id = %s", (job_id,)).fetchone()[0] == 1
        assert c.execute("SELECT count(*) FROM pgjobq.job_steps WHERE job_id = %s AND name = 'cool-off'"
                         " AND result ? 'sleep_until'", (job_id,)).fetchone()[0] == 1
