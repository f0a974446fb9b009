"""B9's Python task: the package's no-op, run by `python3 -m pgjobq.coproc py_tasks:app` under
`pgjobq bench drain-coproc` (bench/run.sh).  The bench's jobs have kind "default" and payload
{"noop": true}.  Kind "stamp" (bench/cost.sh's pickup at 40 processes) returns the wall clock at the
handler's start, stored as the job's result."""
import time

import pgjobq

app = pgjobq.App(name="bench")


@app.task(name="default")
async def default(noop: bool = True) -> None:
    return None


@app.task(name="stamp")
async def stamp(noop: bool = True) -> dict:
    return {"at": time.time()}
