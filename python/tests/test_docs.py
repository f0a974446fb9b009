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
