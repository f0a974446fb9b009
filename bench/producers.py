"""Issue 42's producers: N threads, each in a session of its own, offering RATE jobs/s between them,
one job a transaction, for SECONDS, through one interface:

    sql       psycopg: SELECT pgjobq.enqueue('bench', payload => ...); COMMIT
    python    the pgjobq package: a task's defer(conn); COMMIT
    c         the C library through ctypes (LIB: libpgjobq.so): pgjobq_enqueue on a client of its own
              (its own transaction; the library notifies after the commit, pipelined)

Open loop on an absolute schedule: a producer that falls behind sends at once, and the run ends on
time, so that `jobs_per_s` is the rate the producers reached.  Then, from the history and the jobs
still there, the pickup of the jobs enqueued in the last two thirds of the run that have started:
created_at (the enqueue's transaction start) to started_at (the claim's start), on the database's
clock, p50 and p99 (none when no worker ran).  Prints one JSON line.

Every job's payload carries "t", the producer's clock when it called.  With LAGS (a path prefix),
the pickup to the handler's start is read from the files LAGS.* that bench/py_notify_app.py's task
writes (the same jobs: enqueued in the last two thirds of the run).

Usage: producers.py URL VIA RATE SECONDS [THREADS] [LIB] [LAGS]"""
import ctypes
import json
import sys
import threading
import time

import psycopg

url, via, rate, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
threads = int(sys.argv[5]) if len(sys.argv) > 5 else 8
lib_path = sys.argv[6] if len(sys.argv) > 6 else None
lags = sys.argv[7] if len(sys.argv) > 7 else None

if via == "python":
    import pgjobq

    app = pgjobq.App(name="bench_producers")

    @app.task(name="default", queue="bench")
    def default(n: int = 0, t: float = 0.0) -> None:
        return None

if via == "c":
    lib = ctypes.CDLL(lib_path)
    lib.pgjobq_client_open.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
    lib.pgjobq_client_open.restype = ctypes.c_int
    lib.pgjobq_enqueue.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.pgjobq_enqueue.restype = ctypes.c_int
    lib.pgjobq_client_close.argtypes = [ctypes.c_void_p]
    lib.pgjobq_errmsg.argtypes = [ctypes.c_void_p]
    lib.pgjobq_errmsg.restype = ctypes.c_char_p

    class Opts(ctypes.Structure):
        # pgjobq_enqueue_opts begins with queue and kind; the rest stays zero (its defaults), with
        # room to spare for every field the header adds after them.
        _fields_ = [("queue", ctypes.c_char_p), ("kind", ctypes.c_char_p), ("rest", ctypes.c_char * 512)]

counts = [0] * threads
errors = []
with psycopg.connect(url) as c0:
    db_start = c0.execute("SELECT clock_timestamp()").fetchone()[0]
start = time.monotonic() + 0.5
wall_start = time.time()
end = start + seconds

# The notifications the producers' commits sent for the queue, counted by a session of its own (it
# stops at a notification of its own: "!bench-stop").
notified = [0]


def listen() -> None:
    with psycopg.connect(url, autocommit=True) as lc:
        lc.execute("LISTEN pgjobq")
        ready.set()
        for n in lc.notifies():
            if n.payload == "bench":
                notified[0] += 1
            elif n.payload == "!bench-stop":
                return


ready = threading.Event()
listener = threading.Thread(target=listen)
listener.start()
ready.wait(10)


def produce(i: int) -> None:
    every = threads / rate
    k = 0
    try:
        if via == "c":
            c = ctypes.c_void_p()
            if lib.pgjobq_client_open(ctypes.byref(c), url.encode()) != 0:
                raise RuntimeError(lib.pgjobq_errmsg(c).decode() if c.value else "cannot connect")
            o = Opts(b"bench", None)
        else:
            conn = psycopg.connect(url)
        while True:
            due = start + i * (every / threads) + k * every
            now = time.monotonic()
            if due >= end or now >= end:
                break
            if due > now:
                time.sleep(due - now)
            if via == "sql":
                conn.execute("SELECT pgjobq.enqueue('bench', payload => %s::jsonb)",
                             (json.dumps({"n": k, "t": time.time()}),))
                conn.commit()
            elif via == "python":
                default.defer(conn, n=k, t=time.time())
                conn.commit()
            else:
                payload = ('{"n": %d, "t": %.6f}' % (k, time.time())).encode()
                if lib.pgjobq_enqueue(c, payload, ctypes.byref(o), None) != 0:
                    raise RuntimeError(lib.pgjobq_errmsg(c).decode())
            k += 1
            counts[i] = k
        if via == "c":
            lib.pgjobq_client_close(c)
        else:
            conn.close()
    except Exception as e:  # reported, and the run fails
        errors.append(f"producer {i}: {e}")


ts = [threading.Thread(target=produce, args=(i,)) for i in range(threads)]
for t in ts:
    t.start()
for t in ts:
    t.join()
time.sleep(0.3)
with psycopg.connect(url, autocommit=True) as c1:
    c1.execute("SELECT pg_notify('pgjobq', '!bench-stop')")
listener.join()
if errors:
    print(json.dumps({"error": errors[0]}))
    sys.exit(1)
jobs = sum(counts)
with psycopg.connect(url) as conn:
    row = conn.execute(
        """WITH j AS (SELECT created_at, started_at FROM pgjobq.history WHERE queue = 'bench'
                      UNION ALL SELECT created_at, started_at FROM pgjobq.jobs WHERE queue = 'bench'),
                w AS (SELECT %s::timestamptz + %s * interval '1 second' AS from_t)
           SELECT count(*) FILTER (WHERE started_at IS NOT NULL),
                  percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at) * 1000),
                  percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at) * 1000)
             FROM j, w WHERE j.created_at >= w.from_t AND started_at IS NOT NULL""",
        (db_start, 0.5 + seconds / 3)).fetchone()
handler = []
if lags:
    import glob

    wall_from = wall_start + 0.5 + seconds / 3
    for path in glob.glob(lags + ".*"):
        with open(path) as f:
            for line in f:
                t, lag = line.split()
                if float(t) >= wall_from:
                    handler.append(float(lag))
handler.sort()


def q(p: float):
    return round(handler[min(len(handler) - 1, int(p * len(handler)))], 2) if handler else None


print(json.dumps({"via": via, "threads": threads, "offered_per_s": rate, "seconds": seconds, "jobs": jobs,
                  "jobs_per_s": round(jobs / seconds, 1), "notifications": notified[0],
                  "notifications_per_job": round(notified[0] / jobs, 3) if jobs else None, "started": row[0],
                  "pickup_p50_ms": round(row[1], 2) if row[1] is not None else None,
                  "pickup_p99_ms": round(row[2], 2) if row[2] is not None else None,
                  "handler_started": len(handler), "handler_p50_ms": q(0.5), "handler_p99_ms": q(0.99)},
                 separators=(",", ":")))
