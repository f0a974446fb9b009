#!/usr/bin/env python3
"""B9's Python no-op coprocess: examples/coproc.py's loop (read what has arrived, parse each job
line with json, answer all of it in one write) around a handler that does nothing and returns no
result, the counterpart of the in-process no-op handler it is compared with (bench/run.sh).
examples/coproc.py itself echoes each payload back as the job's result, which the database then
stores: B9 reports it beside this one."""
import json
import os


def handle(job):
    return None


rest = b""
while True:
    data = os.read(0, 1 << 16)
    if not data:
        break  # end of input: the worker is stopping
    *lines, rest = (rest + data).split(b"\n")
    replies = []
    for line in lines:
        if not line.strip():
            continue
        msg = json.loads(line)
        if "cancel" in msg:
            continue
        result = handle(msg)
        reply = {"id": msg["id"], "status": "completed"}
        if result is not None:
            reply["result"] = result
        replies.append(json.dumps(reply) + "\n")
    if replies:
        out = "".join(replies).encode()
        while out:
            out = out[os.write(1, out):]
