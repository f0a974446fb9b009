"""bench/notify.sh's worker app (``python3 -m pgjobq worker py_notify_app:app``): a no-op task on queue
"bench" that notes, when $PGJOBQ_BENCH_LAGS is set, how long after its producer's call it started: a
line "T LAG_MS" per job in $PGJOBQ_BENCH_LAGS.PID, T the producer's clock when it called (the payload's
"t"; the producers run on the same machine, so the clocks are one).  bench/producers.py reads them."""
import os
import time

import pgjobq

app = pgjobq.App(name="bench_notify")
_path = os.environ.get("PGJOBQ_BENCH_LAGS")


@app.task(name="default", queue="bench")
def default(n: int = 0, t: float = 0.0) -> None:
    if _path and t:
        lag_ms = (time.time() - t) * 1000.0
        with open(f"{_path}.{os.getpid()}", "a") as f:
            f.write(f"{t:.6f} {lag_ms:.3f}\n")
