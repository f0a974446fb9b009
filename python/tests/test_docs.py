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


def tour_script(doc: str, heading: str = "Five-minute tour", least: int = 6) -> str:
    section = doc.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    parts = []
    for lang, body in re.findall(r"\n```(\w+)\n(.*?)\n```\n", section, re.S):
        if lang == "sh":
            parts.append(body)
        elif lang == "python":
            m = re.match(r"# (\w+\.py)\n", body)
            assert m, f"a python block of the tour names no file:\n{body[:200]}"
            parts.append(f"cat > {m.group(1)} <<'PGJOBQ_TOUR_EOF'\n{body}\nPGJOBQ_TOUR_EOF")
    assert len(parts) >= least, f"{heading} has fewer blocks than expected: was it renamed?"
    # If a step fails, the worker the tour started is stopped all the same.
    return "set -e\nworker=\ntrap '[ -z \"$worker\" ] || kill -TERM \"$worker\" 2>/dev/null || true' EXIT\n" + "\n".join(parts) + "\n"


def run_section(tmp_path, heading, least):
    with open(os.path.join(REPO, "docs", "python.md")) as f:
        script = tour_script(f.read(), heading, least)
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
        raise AssertionError(f"{heading} did not finish in 90 s:\n{out}")
    assert proc.returncode == 0, out
    return out


def test_the_tour_runs_as_written(tmp_path):
    out = run_section(tmp_path, "Five-minute tour", 6)
    assert "{'sent': 'ana" in out and "failed: no such domain" in out, out
    assert "{'month': '2026-11', 'attempt': 2}" in out and "queued cancelled" in out, out
    assert "tour:nightly_report" in out, out


def test_testing_your_tasks_runs_as_written(tmp_path):
    out = run_section(tmp_path, "Testing your tasks", 4)
    assert "2 passed" in out and "the burst worker is done" in out, out
