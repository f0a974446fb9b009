#!/usr/bin/env python3
"""A pgjobq handler in Python, started once and fed jobs as JSON lines (docs/coproc.md):
    pgjobq work --queue mail:16 --coproc 'python3 examples/coproc.py'

It reads what the worker has sent so far and answers all of it in one write: a burst of jobs then
costs the worker one wakeup each way rather than one per job (a line at a time works too, slower).
"""
import json
import os


def handle(job):
    payload = job["payload"]
    if payload.get("fail"):
        raise ValueError("asked to fail")
    return {"echo": payload, "attempt": job["attempt"]}


def answer(msg):
    try:
        return {"id": msg["id"], "status": "completed", "result": handle(msg)}
    except Exception as e:  # a failed attempt: retried with backoff until max_attempts
        return {"id": msg["id"], "status": "retry", "error": str(e)}


rest = b""
while True:
    data = os.read(0, 1 << 16)  # whatever has arrived, up to 64 KiB
    if not data:
        break  # end of input: the worker is stopping
    *lines, rest = (rest + data).split(b"\n")
    replies = []
    for line in lines:
        if not line.strip():
            continue
        msg = json.loads(line)
        if "cancel" in msg:  # the worker gave this job up (timeout, cancel): nothing to answer
            continue
        replies.append(json.dumps(answer(msg)) + "\n")
    if replies:
        out = "".join(replies).encode()
        while out:
            out = out[os.write(1, out):]
