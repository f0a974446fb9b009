"""The App of test_cluster.py's worker test: a task that defers another job from inside the worker,
which the cluster ($PGJOBQ_CLUSTER, given by `python3 -m pgjobq worker --cluster`) routes to its shard."""

import pgjobq

app = pgjobq.App(name="pycluster")


@app.task
def fan_out(queue, tenant):
    job = echo.configure(queue=queue).defer(route_key=tenant, tenant=tenant)
    return {"deferred": job.id}


@app.task
def echo(tenant):
    return {"tenant": tenant}
