"""The coprocess side's shortcuts, against what they stand for: the payload check that replaces
Signature.bind, and a Context's cancel event made only when asked for."""

from __future__ import annotations

import inspect
import threading
import time

import pytest

import pgjobq
from pgjobq.context import Context


def _sigs():
    app = pgjobq.App(name="sigs")

    def plain(a, b):
        pass

    def defaults(a, b=2, *, c, d=4):
        pass

    def anything(a, **rest):
        pass

    def none():
        pass

    def positional_only(a, /, b):
        pass

    def star_args(*args, b):
        pass

    def with_ctx(ctx, a, b=1):
        pass

    fns = [plain, defaults, anything, none, positional_only, star_args]
    tasks = [app.task(name=f.__name__)(f) for f in fns]
    tasks.append(app.task(name="with_ctx", pass_context=True)(with_ctx))
    return tasks


PAYLOADS = [{}, {"a": 1}, {"a": 1, "b": 2}, {"a": 1, "b": 2, "c": 3}, {"b": 2}, {"c": 3},
            {"a": 1, "c": 3}, {"a": 1, "b": 2, "c": 3, "d": 4}, {"a": 1, "b": 2, "e": 5}, {"args": 1, "b": 2}]


def test_payload_check_says_what_signature_bind_says():
    checked = 0
    for task in _sigs():
        for payload in PAYLOADS:
            try:
                task._payload_sig.bind(**payload)
                binds = True
            except TypeError:
                binds = False
            assert task._fits(payload) == binds, (task.name, payload)
            checked += 1
    assert checked == 7 * len(PAYLOADS)


def test_payload_check_takes_the_shortcut_only_where_it_is_exact():
    by_name = {t.name: t for t in _sigs()}
    assert by_name["plain"]._kw_names == frozenset({"a", "b"})
    assert by_name["defaults"]._kw_required == frozenset({"a", "c"})
    assert by_name["anything"]._kw_any
    assert by_name["with_ctx"]._kw_names == frozenset({"a", "b"})  # the context is not the payload's
    assert by_name["positional_only"]._kw_names is None  # bind's rules
    assert by_name["star_args"]._kw_names is None
    assert inspect.signature(by_name["plain"].fn).parameters.keys() == {"a", "b"}


def _ctx():
    return Context(1, "q", "k", 1, 3, {}, [], time.monotonic() + 60)


def test_cancel_before_the_event_is_asked_for():
    ctx = _ctx()
    assert not ctx.cancelled
    ctx._cancel("gone")
    assert ctx.cancelled and ctx.reason == "gone"
    assert ctx.cancel_event.is_set()  # made now, already set
    ctx._cancel("again")
    assert ctx.reason == "gone"


def test_cancel_wakes_a_thread_waiting_on_the_event():
    ctx = _ctx()
    seen = []
    waiter = threading.Thread(target=lambda: seen.append(ctx.cancel_event.wait(10)))
    waiter.start()
    time.sleep(0.05)
    assert not ctx.cancel_event.is_set() and ctx.cancel_event is ctx.cancel_event
    ctx._cancel("timed out")
    waiter.join(10)
    assert seen == [True] and ctx.cancelled
    with pytest.raises(pgjobq.Cancelled, match="timed out"):
        ctx.raise_if_cancelled()
