#!/usr/bin/env python3
"""The seed thread's case, in Python: an order and the job that confirms it commit together, or
neither does.  The application uses SQLAlchemy (Debian 12: python3-sqlalchemy 1.4, whose PostgreSQL
driver is psycopg2, python3-psycopg2); the worker side uses psycopg 3 (python3-psycopg) directly.
Nothing of pgjobq but its SQL API.

    PGJOBQ_DATABASE_URL="$(pgjobq db url)" python3 examples/python/orders.py
"""
import json
import os
import sys

import psycopg
import psycopg2
from sqlalchemy import create_engine, text

conninfo = os.environ.get("PGJOBQ_DATABASE_URL") or sys.exit("set PGJOBQ_DATABASE_URL, e.g. to $(pgjobq db url)")
engine = create_engine("postgresql+psycopg2://", creator=lambda: psycopg2.connect(conninfo))

with engine.begin() as db:
    db.execute(text("CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, customer text NOT NULL)"))


def place_order(order_id, customer, payment_ok=True):
    """Inserts the order and enqueues its confirmation in the same transaction."""
    with engine.begin() as db:  # BEGIN; ... COMMIT, or ROLLBACK when the block raises
        db.execute(text("INSERT INTO orders (id, customer) VALUES (:id, :customer)"),
                   {"id": order_id, "customer": customer})
        job_id = db.execute(text("SELECT id FROM pgjobq.enqueue(queue => 'mail', kind => 'order_confirmation',"
                                 " payload => CAST(:payload AS jsonb))"),
                            {"payload": json.dumps({"order": order_id})}).scalar_one()
        if not payment_ok:
            raise RuntimeError("payment declined")
        return job_id


job_id = place_order(1001, "ana")
try:
    place_order(1002, "bo", payment_ok=False)
except RuntimeError as e:
    print(f"order 1002 rolled back ({e}): no order, no job")

# The worker's side, with psycopg 3 and the SQL API: claim with a lease, work outside any
# transaction, then complete; the lease token fences the completion (a worker whose lease expired
# changes nothing).
with psycopg.connect(conninfo, autocommit=True) as conn:
    claimed = conn.execute("SELECT id, lease_token, payload FROM pgjobq.claim('mail', 10, '30 seconds',"
                           " 'python-example')").fetchall()
    results = [json.dumps({"sent_to": f"customer of order {payload['order']}"}) for _, _, payload in claimed]
    outcomes = conn.execute("SELECT id, outcome FROM pgjobq.complete_many(%s, %s, %s::jsonb[])",
                            ([r[0] for r in claimed], [r[1] for r in claimed], results)).fetchall()
for jid, outcome in outcomes:
    print(f"job {jid}: {outcome}")

with engine.begin() as db:
    state = db.execute(text("SELECT state FROM pgjobq.all_jobs WHERE id = :id"), {"id": job_id}).scalar_one()
    stray = db.execute(text("SELECT count(*) FROM pgjobq.all_jobs WHERE payload @> '{\"order\": 1002}'")).scalar_one()
print(f"order 1001: job {job_id} is {state}; jobs for order 1002: {stray}")
sys.exit(0 if state == "completed" and stray == 0 else 1)
