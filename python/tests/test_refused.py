"""An outcome PostgreSQL would refuse costs only its own job (issue 36): a task that asks for a retry
4,000,000 days away (a run_at past the year 9999) among mates whose retries are written in the same
batch.  The package refuses such a delay where the task raises it (InvalidArgument, a failed attempt
saying why), and the engine would isolate it had it been sent (tests/test_worker.c): either way the
mates' outcomes are written as they asked."""

import py_tasks
from conftest import URL, scalar, wait_until
from test_worker import FAST


def test_a_retry_the_database_refuses_costs_its_batch_mates_nothing(start_worker, queue, tmp_path):
    d = str(tmp_path)
    k = 8
    task = py_tasks.gathered.configure(queue=queue)
    ids = [task.defer(URL, n=n, d=d, k=k).id for n in range(k)]
    worker = start_worker("--queue", f"{queue}:{k}", *FAST)
    wait_until(lambda: scalar("SELECT count(*) FROM pgjobq.history WHERE queue = %s", queue) == k, 60,
               f"the {k} jobs to finish", worker.log)
    # The mates' first attempts were written as they asked (a retry, 'soon'), not dropped with the
    # refused one (their leases would have expired, and the rescue would have said so).
    assert scalar("SELECT count(*) FROM pgjobq.history WHERE id = ANY(%s) AND state = 'completed'"
                  " AND attempt = 2 AND last_error = 'soon'", ids[1:]) == k - 1
    # The refused retry: a failed attempt of its own, run again, whose last attempt failed for good.
    assert scalar("SELECT state || ' ' || attempt FROM pgjobq.history WHERE id = %s", ids[0]) == "failed 2"
    assert "100 years" in scalar("SELECT last_error FROM pgjobq.history WHERE id = %s", ids[0])
