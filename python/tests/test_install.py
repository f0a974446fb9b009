"""The install lines of README.md and docs/python.md work as written on Debian 12: each block runs in
a fresh directory holding a copy of python/ (as ./python), with Debian's python3 first on PATH and
pip kept off the network, and the venv it makes can import the package and a driver, and enqueue."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import PYDIR, URL, scalar

REPO = os.path.dirname(PYDIR)


def install_block(path, heading):
    """The first ```console block under `heading` of the file that runs pip install."""
    with open(os.path.join(REPO, path)) as f:
        doc = f.read()
    assert heading in doc, f"{path} has no {heading!r}"
    section = doc.split(heading, 1)[1]
    for body in re.findall(r"\n```console\n(.*?)\n```\n", section, re.S):
        if "pip install" in body:
            return body
    raise AssertionError(f"{path}: no console block with `pip install` under {heading!r}")


def commands(block):
    return [line[2:] for line in block.splitlines() if line.startswith("$ ")]


def apt_packages(cmd):
    """The packages of a `sudo apt-get install ...` line (before its comment)."""
    words = cmd.split("#", 1)[0].split()
    assert words[:3] == ["sudo", "apt-get", "install"], cmd
    return [w for w in words[3:] if not w.startswith("-")]


def debian_installed(pkg):
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                       text=True)
    return r.returncode == 0 and r.stdout.endswith("installed")


def run_install(block, tmp_path):
    """Runs the block's commands in tmp_path/home with ./python there; returns the venv's python."""
    home = tmp_path / "home"
    home.mkdir()
    shutil.copytree(PYDIR, home / "python", ignore=shutil.ignore_patterns("tests", "__pycache__", "build",
                                                                       "*.egg-info"))
    lines = []
    for cmd in commands(block):
        if cmd.startswith("sudo apt-get"):
            # Not run here: what it names must be what this machine has (ensure-deps.sh --tests installs it).
            missing = [p for p in apt_packages(cmd) if not debian_installed(p)]
            assert not missing, f"the install line names {missing}, not installed here"
            continue
        lines.append(cmd)
    assert lines, block
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PIP_"))}
    # Debian's python3 first (as on a fresh Debian 12), and pip offline: no index, no version check.
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), "/usr/bin", "/bin", env.get("PATH", "")])
    env["PIP_NO_INDEX"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["HOME"] = str(tmp_path)
    r = subprocess.run(["bash", "-e", "-c", "\n".join(lines)], cwd=str(home), env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=240)
    assert r.returncode == 0, f"the install block failed:\n{block}\n{r.stdout}"
    python = home / "venv" / "bin" / "python"
    assert python.exists(), f"the install block made no venv/:\n{block}"
    return str(python), env, home


@pytest.mark.parametrize("path,heading", [("README.md", "### From Python"), ("docs/python.md", "## Install")])
def test_the_install_line_works_as_written(path, heading, tmp_path, queue):
    block = install_block(path, heading)
    python, env, home = run_install(block, tmp_path)
    probe = ("import importlib.metadata as m, sys, pgjobq, psycopg\n"
             "print(pgjobq.__file__)\n"
             "print(sorted(m.metadata('pgjobq').get_all('Provides-Extra')))\n"
             "print(pgjobq.enqueue(sys.argv[1], 'installed', {}, queue=sys.argv[2]).id)\n")
    r = subprocess.run([python, "-c", probe, URL, queue], cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60)
    assert r.returncode == 0, r.stdout
    where, extras, job = r.stdout.split("\n")[:3]
    assert where.startswith(str(home / "venv")), where  # the installed copy, not the source tree
    assert extras == "['psycopg', 'psycopg2', 'sqlalchemy']", extras
    assert scalar("SELECT kind FROM pgjobq.all_jobs WHERE id = %s AND queue = %s", int(job), queue) == "installed"


def test_the_docs_name_the_extras():
    for path in ("README.md", "docs/python.md"):
        with open(os.path.join(REPO, path)) as f:
            doc = f.read()
        for extra in ("[psycopg]", "psycopg2", "sqlalchemy"):
            assert extra in doc, f"{path} does not name the extra {extra}"


def test_a_missing_driver_names_the_extra(tmp_path):
    """Without psycopg and psycopg2 (a venv that does not see Debian's), a URL says what to install."""
    code = ("import sys; sys.modules['psycopg'] = None; sys.modules['psycopg2'] = None\n"
            "import pgjobq\n"
            "try:\n    pgjobq.enqueue('postgresql:///nowhere', 'k', {})\n"
            "except pgjobq.PgjobqError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": PYDIR}, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    assert "pgjobq[psycopg]" in r.stdout, r.stdout
