"""A release of an application, for test_deploy.py: it has a task py_tasks' App does not (``charge``),
and its tasks module can be broken as a real one is (a package the new release needs but the
deployment lacks): everywhere with $DEPLOY_BROKEN=everywhere; in the coprocess only (the module
changed between the worker's start and a restart of its coprocess) while the file $DEPLOY_FIXED does
not exist."""

import os

import pgjobq

_in_coprocess = "PGJOBQ_COPROC_PROTOCOL" in os.environ
if os.environ.get("DEPLOY_BROKEN") == "everywhere" or (
        _in_coprocess and os.environ.get("DEPLOY_FIXED") and not os.path.exists(os.environ["DEPLOY_FIXED"])):
    import stripe_is_not_installed  # noqa: F401

app = pgjobq.App(queue=os.environ.get("DEPLOY_QUEUE", "default"))


@app.task(pass_context=True)
def charge(ctx, order):
    return {"charged": order, "attempt": ctx.attempt}
