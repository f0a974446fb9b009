"""``python3 -m pgjobq worker --reload``: for development, the worker is started again when a module
file of the application changes.

This process stays the parent of ``pgjobq work`` (which runs in a process group of its own, so that
a Ctrl-C reaches it once, from here).  Every half second it looks at the ``.py`` files of the
application's modules (those imported with the App from outside the standard library, the
site-packages and this package) and at the other ``.py`` files of their directories.  When one
changes, the new code is first imported in a separate process: if that fails, the traceback is
printed and the running worker is left as it is.  Otherwise the worker gets SIGTERM: it claims
nothing more and lets its running jobs finish (up to its ``--shutdown-timeout``, 30 s by default,
after which they are handed back without using an attempt), exits, and is started again on the new
code.  No attempt is lost either way.  SIGTERM or SIGINT here is passed on to the worker (a second
one hands its running jobs back at once), and this process exits with the worker's status.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import time
from typing import Dict, List, Optional, Tuple

POLL_S = 0.5
_PKG = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _library_dirs() -> Tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return tuple(os.path.abspath(d) + os.sep for d in dirs if d) + (_PKG,)


def app_files() -> List[str]:
    """The .py files of the application's imported modules."""
    skip = _library_dirs()
    out = set()
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if not f or not f.endswith(".py"):
            continue
        f = os.path.abspath(f)
        if f.startswith(skip) or os.sep + "site-packages" + os.sep in f or os.sep + "dist-packages" + os.sep in f:
            continue
        out.add(f)
    return sorted(out)


def snapshot(files: List[str]) -> Dict[str, Tuple[float, int]]:
    """(mtime, size) of the files and of every .py file in their directories (a new module too)."""
    seen: Dict[str, Tuple[float, int]] = {}
    for d in sorted({os.path.dirname(f) for f in files}):
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            if e.name.endswith(".py"):
                try:
                    st = e.stat()
                except OSError:
                    continue
                seen[e.path] = (st.st_mtime, st.st_size)
    for f in files:
        if f not in seen:
            try:
                st = os.stat(f)
                seen[f] = (st.st_mtime, st.st_size)
            except OSError:
                seen[f] = (0.0, -1)  # gone: its return is a change
    return seen


def _changed(old: Dict[str, Tuple[float, int]], new: Dict[str, Tuple[float, int]]) -> Optional[str]:
    for f in sorted(set(old) | set(new)):
        if old.get(f) != new.get(f):
            return f
    return None


def _imports(app: str, env: Dict[str, str]) -> Optional[str]:
    """None when the App imports in a fresh interpreter, else what it printed."""
    code = "import sys\nfrom pgjobq._runner import load_app\nload_app(sys.argv[1])\n"
    r = subprocess.run([sys.executable, "-c", code, app], env=env, cwd=os.getcwd(), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    return None if r.returncode == 0 else r.stdout.strip() or f"exit status {r.returncode}"


def _say(text: str) -> None:
    print(f"pgjobq worker: {text}", file=sys.stderr, flush=True)


def run(cmd: List[str], env: Dict[str, str], app: str) -> int:
    """Runs cmd (``pgjobq work ...``) until a signal stops it, starting it again after each change of
    the application's files.  Returns the worker's exit status."""
    signals: List[int] = []

    def on_signal(sig: int, frame: object) -> None:
        signals.append(sig)

    old_term = signal.signal(signal.SIGTERM, on_signal)
    old_int = signal.signal(signal.SIGINT, on_signal)
    try:
        files = app_files()
        seen = snapshot(files)
        _say(f"--reload: watching {len(seen)} files under {', '.join(sorted({os.path.dirname(f) for f in files}))}")
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        passed = 0
        while True:
            rc = proc.poll()
            if rc is not None:
                return rc  # stopped by our signal, or by itself (a fatal error): its status is ours
            if len(signals) > passed:
                passed += 1
                proc.send_signal(signal.SIGTERM)  # the worker's own rules: drain, or hand back at the second
            time.sleep(POLL_S)
            if signals:
                continue
            now = snapshot(files)
            what = _changed(seen, now)
            if what is None:
                continue
            seen = now
            broken = _imports(app, env)
            if broken is not None:
                _say(f"{what} changed, but {app} does not import now; the worker goes on with the code it "
                     f"has:\n{broken}")
                continue
            _say(f"{what} changed: restarting the worker (running jobs finish first)")
            proc.send_signal(signal.SIGTERM)
            while proc.poll() is None:
                if len(signals) > passed:  # a stop request meanwhile: ours to pass on, and no restart
                    passed += 1
                    proc.send_signal(signal.SIGTERM)
                time.sleep(0.05)
            if signals:
                return proc.returncode
            proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    finally:
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGINT, old_int)
