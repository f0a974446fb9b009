#!/usr/bin/env python3
"""The seed thread's case with the pgjobq package: an order and the job that confirms it commit
together, or neither does.  The application uses SQLAlchemy (Debian 12: python3-sqlalchemy 1.4 on
psycopg2); the job is a task, deferred in the application's own session; pgjobq's C engine runs
it (`python3 -m pgjobq worker`, started and stopped here for the example's sake).

    PGJOBQ_DATABASE_URL="$(pgjobq db url)" python3 examples/python/orders.py

Rerunnable: it keeps to its own table (python_orders) and queue (python-orders), and starts by
removing the two orders of its last run.
"""
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
try:
    import pgjobq
except ImportError:  # not installed (pip install ./python): the source tree's
    sys.path.insert(0, os.path.join(REPO, "python"))
    import pgjobq

QUEUE = "python-orders"
app = pgjobq.App(queue=QUEUE)  # the database: $PGJOBQ_DATABASE_URL


@app.task(name="order_confirmation", max_attempts=5, timeout="30s")
def order_confirmation(order: int) -> dict:
    """Runs in the worker (the coprocess of `pgjobq work`), never in the web request."""
    return {"sent_to": f"customer of order {order}"}


def place_order(engine, order_id, customer, payment_ok=True):
    """Inserts the order and defers its confirmation in the same transaction."""
    from sqlalchemy import text
    from sqlalchemy.orm import Session

    with Session(engine) as session, session.begin():  # COMMIT at the end, or ROLLBACK if it raises
        session.execute(text("INSERT INTO python_orders (id, customer) VALUES (:id, :customer)"),
                        {"id": order_id, "customer": customer})
        job = order_confirmation.defer(session, order=order_id)
        if not payment_ok:
            raise RuntimeError("payment declined")
        return job


def pgjobq_command():
    for c in (os.environ.get("PGJOBQ_BIN"), os.environ.get("PGJOBQ_CLI"), shutil.which("pgjobq"),
              os.path.join(REPO, "build", "pgjobq")):
        if c and os.access(c, os.X_OK):
            return c
    sys.exit("cannot find the pgjobq command: run make, or put it on PATH")


def main():
    import psycopg2
    from sqlalchemy import create_engine, text

    conninfo = os.environ.get("PGJOBQ_DATABASE_URL") or sys.exit("set PGJOBQ_DATABASE_URL, e.g. to $(pgjobq db url)")
    engine = create_engine("postgresql+psycopg2://", creator=lambda: psycopg2.connect(conninfo))
    with engine.begin() as db:
        db.execute(text("CREATE TABLE IF NOT EXISTS python_orders (id bigint PRIMARY KEY, customer text NOT NULL)"))
        db.execute(text("DELETE FROM python_orders WHERE id IN (1001, 1002)"))

    job = place_order(engine, 1001, "ana")
    try:
        place_order(engine, 1002, "bo", payment_ok=False)
    except RuntimeError as e:
        print(f"order 1002 rolled back ({e}): no order, no job")

    # The worker: pgjobq's engine claims, leases and retries; Python runs the task.  In production it
    # is a service of its own: python3 -m pgjobq worker orders:app --queue python-orders:32
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "python"), HERE]))
    worker = subprocess.Popen([sys.executable, "-m", "pgjobq", "worker", "orders:app", "--pgjobq", pgjobq_command(),
                               "--queue", f"{QUEUE}:4", "--", "--log-level", "warn"], cwd=HERE, env=env)
    try:
        result = app.result(job.id, timeout=30)  # waits until the job has finished
    finally:
        worker.terminate()  # SIGTERM drains: running jobs finish, then it exits 0
        worker.wait(30)
    print(f"job {job.id}: {result}")

    with engine.begin() as db:
        state = db.execute(text("SELECT state FROM pgjobq.all_jobs WHERE id = :id"), {"id": job.id}).scalar_one()
        stray = db.execute(text("SELECT count(*) FROM pgjobq.all_jobs WHERE queue = :q AND payload @> CAST(:p AS jsonb)"),
                           {"q": QUEUE, "p": '{"order": 1002}'}).scalar_one()
    print(f"order 1001: job {job.id} is {state}; jobs for order 1002: {stray}")
    return 0 if state == "completed" and stray == 0 and worker.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
