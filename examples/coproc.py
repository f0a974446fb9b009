#!/usr/bin/env python3
"""A pgjobq handler in Python, started once and fed jobs as JSON lines (docs/coproc.md):
    pgjobq work --queue mail:16 --coproc 'python3 examples/coproc.py'
"""
import json
import sys


def handle(job):
    payload = job["payload"]
    if payload.get("fail"):
        raise ValueError("asked to fail")
    return {"echo": payload, "attempt": job["attempt"]}


for line in sys.stdin:
    msg = json.loads(line)
    if "cancel" in msg:  # the worker gave this job up (timeout, cancel): nothing to answer
        continue
    try:
        reply = {"id": msg["id"], "status": "completed", "result": handle(msg)}
    except Exception as e:  # a failed attempt: retried with backoff until max_attempts
        reply = {"id": msg["id"], "status": "retry", "error": str(e)}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
