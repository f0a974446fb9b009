"""A job's trace context (docs/queues.md, "Trace context"): given to defer/enqueue, or taken from the
caller's current OpenTelemetry span; stored, refused when it is not a W3C traceparent (nothing of the
call written), shown by get, and handed to the task as ctx.traceparent (the worker's coprocess and
run_inline)."""

import os
import sys
import types

import pytest

import pgjobq
import py_tasks
from conftest import URL, scalar

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TP2 = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"


def test_given_explicitly_on_every_path_and_handed_to_the_task(queue):
    task = py_tasks.trace_of.configure(queue=queue)
    one = task.configure(traceparent=TP).defer(URL)
    plain = task.defer(URL)
    many = pgjobq.enqueue_many(URL, [pgjobq.JobSpec("trace_of", {}, queue=queue, traceparent=TP2),
                                     pgjobq.JobSpec("trace_of", {}, queue=queue)])
    graph = pgjobq.enqueue_graph(URL, [pgjobq.JobSpec("trace_of", {}, queue=queue, ref="a", traceparent=TP),
                                       pgjobq.JobSpec("trace_of", {}, queue=queue, after=["a"])])
    assert pgjobq.get(URL, one.id).traceparent == TP
    assert pgjobq.get(URL, plain.id).traceparent is None
    assert [pgjobq.get(URL, e.id).traceparent for e in many] == [TP2, None]
    assert pgjobq.get(URL, graph["a"]).traceparent == TP
    counts = py_tasks.app.run_inline([queue], conn=URL)
    assert counts.get("completed") == 6, counts
    assert pgjobq.get(URL, one.id).result == {"traceparent": TP}
    assert pgjobq.get(URL, plain.id).result == {"traceparent": None}
    assert pgjobq.get(URL, many[0].id).result == {"traceparent": TP2}


def test_handed_to_the_task_by_the_worker(start_worker, queue):
    job = py_tasks.trace_of.configure(queue=queue, traceparent=TP).defer(URL)
    start_worker("--queue", f"{queue}:1", "--", "--poll", "100ms")
    assert py_tasks.app.result(job.id, timeout=30, conn=URL) == {"traceparent": TP}


@pytest.mark.parametrize("bad", ["00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
                                 "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "nope"])
def test_a_bad_one_is_refused_and_nothing_is_written(queue, bad):
    with pytest.raises(pgjobq.InvalidJob, match="is not a W3C traceparent"):
        py_tasks.trace_of.configure(queue=queue, traceparent=bad).defer(URL)
    with pytest.raises(pgjobq.InvalidJob, match=r"traceparents\[2\]"):
        pgjobq.enqueue_many(URL, [pgjobq.JobSpec("trace_of", {}, queue=queue, traceparent=TP),
                                  pgjobq.JobSpec("trace_of", {}, queue=queue, traceparent=bad)])
    with pytest.raises(pgjobq.InvalidJob, match="traceparent must be a str"):
        py_tasks.trace_of.configure(queue=queue, traceparent=1).defer(URL)
    assert scalar("SELECT count(*) FROM pgjobq.all_jobs WHERE queue = %s", queue) == 0


def test_taken_from_the_current_opentelemetry_span(queue, monkeypatch):
    """Without opentelemetry imported, no trace context; with a current span (a stand-in for the
    package's API: get_current_span().get_span_context()), its traceparent, unless one is given."""
    assert "opentelemetry.trace" not in sys.modules  # (not installed here: the package never imports it)
    assert pgjobq.get(URL, py_tasks.trace_of.configure(queue=queue).defer(URL).id).traceparent is None

    class SpanContext:
        def __init__(self, valid):
            self.trace_id, self.span_id, self.trace_flags = 0x4BF92F3577B34DA6A3CE929D0E0E4736, 0xF067AA0BA902B7, 1
            self.is_valid = valid

    current = {"span": SpanContext(True)}
    span = types.SimpleNamespace(get_span_context=lambda: current["span"])
    fake = types.ModuleType("opentelemetry.trace")
    fake.get_current_span = lambda: span
    monkeypatch.setitem(sys.modules, "opentelemetry", types.ModuleType("opentelemetry"))
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", fake)

    auto = py_tasks.trace_of.configure(queue=queue).defer(URL)
    given = py_tasks.trace_of.configure(queue=queue, traceparent=TP2).defer(URL)
    many = pgjobq.enqueue_many(URL, [pgjobq.JobSpec("trace_of", {}, queue=queue)])
    assert pgjobq.get(URL, auto.id).traceparent == TP
    assert pgjobq.get(URL, given.id).traceparent == TP2
    assert pgjobq.get(URL, many[0].id).traceparent == TP
    current["span"] = SpanContext(False)  # no span (INVALID_SPAN): none
    assert pgjobq.get(URL, py_tasks.trace_of.configure(queue=queue).defer(URL).id).traceparent is None
