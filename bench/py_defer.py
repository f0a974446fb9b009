"""B9's enqueue from Python: defer N jobs of a task in one call (one statement, the caller's
transaction), timed; prints {"jobs": N, "seconds": S, "jobs_per_s": R}.  Usage: py_defer.py URL N"""
import json
import sys
import time

import psycopg

import pgjobq

app = pgjobq.App(name="bench_defer")


@app.task(name="default", queue="bench_py")
def default(n: int = 0) -> None:
    return None


def main() -> None:
    url, n = sys.argv[1], int(sys.argv[2])
    with psycopg.connect(url) as conn:
        specs = [default.spec(n=i) for i in range(n)]
        t0 = time.monotonic()
        pgjobq.enqueue_many(conn, specs)
        conn.commit()
        s = time.monotonic() - t0
        # Out of the way of the next run, through the API (they end cancelled, in the history).
        app.cancel_where("bench_py", "queued", conn=conn)
        conn.commit()
    print(json.dumps({"jobs": n, "seconds": round(s, 3), "jobs_per_s": round(n / s, 1)}))


if __name__ == "__main__":
    main()
