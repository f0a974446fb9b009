#!/usr/bin/env python3
# The examples/coproc.py handler in the --exec form (B9's comparison): one process per job, the
# payload on stdin, the result on stdout.
import json
import sys

payload = json.load(sys.stdin)
print(json.dumps({"echo": payload, "attempt": 1}))
