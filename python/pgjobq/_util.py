"""Durations, JSON checks and names: what is checked before anything is sent."""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
from typing import Any, Union

from .errors import InvalidArgument, InvalidJob

Duration = Union[int, float, str, _dt.timedelta]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "": 1.0}
# Matched with fullmatch: `$` would also match before a final newline ("mail\n" passed as a name).
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d|)")
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.:-]{0,63}")
PAYLOAD_MAX = 1048576
DELAY_MAX_S = 3155760000.0  # 100 years: the cap of every delay pgjobq takes (now() + it cannot overflow)


def seconds(value: Duration, what: str = "duration") -> float:
    """Seconds from a number of seconds, a timedelta, or a duration as the pgjobq command reads them
    ("500ms", "30s", "5m", "2h", "1d"; a bare number is seconds)."""
    if isinstance(value, bool):
        raise InvalidArgument(f"{what}: {value!r} is not a duration")
    if isinstance(value, _dt.timedelta):
        s = value.total_seconds()
    elif isinstance(value, (int, float)):
        s = float(value)
    elif isinstance(value, str):
        m = _DURATION.fullmatch(value.strip())
        if not m:
            raise InvalidArgument(f"{what}: {value!r} is not a duration (use e.g. 30, \"30s\", \"500ms\", \"5m\", \"2h\", \"1d\")")
        s = float(m.group(1)) * _UNITS[m.group(2)]
    else:
        raise InvalidArgument(f"{what}: {value!r} is not a duration (a number of seconds, a timedelta or a string such as \"30s\")")
    if not math.isfinite(s) or s < 0:
        raise InvalidArgument(f"{what}: {value!r} must be a finite, non-negative duration")
    return s


def delay_seconds(value: Duration, what: str) -> float:
    """seconds(), at most 100 years (a retry after that is out of the jobs table's range)."""
    s = seconds(value, what)
    if s > DELAY_MAX_S:
        raise InvalidArgument(f"{what}: {value!r} is more than 100 years")
    return s


def is_name(value: Any) -> bool:
    """A queue, kind or schedule name as the database takes it: a letter, then up to 63 letters, digits,
    _ . : - (and nothing after, not even a newline)."""
    return isinstance(value, str) and NAME.fullmatch(value) is not None


_PASSWORDS = (re.compile(r"(://[^:/?#@\s]*:)[^@\s]*(@)"),                 # scheme://user:PASSWORD@
              re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]*)", re.I))  # password=... (conninfo, URL query)


def redact(text: str) -> str:
    """text with what looks like a password (in a URL, after password=) replaced by ***, for
    messages that may quote a database URL or a driver's error about one."""
    text = _PASSWORDS[0].sub(r"\1***\2", text)
    return _PASSWORDS[1].sub(r"\1***", text)


def check_json(value: Any, where: str, path: str = "") -> None:
    """Raises InvalidJob naming the first value that JSON cannot carry as it is: anything but None,
    bool, int, finite float, str, list, tuple and dict with str keys."""
    stack = [(value, path)]
    while stack:
        v, p = stack.pop()
        if v is None or isinstance(v, (bool, int, str)):
            continue
        if isinstance(v, float):
            if not math.isfinite(v):
                raise InvalidJob(f"{where}: {p or 'the value'} is {v!r}, which JSON cannot hold")
            continue
        if isinstance(v, (list, tuple)):
            stack.extend((x, f"{p}[{i}]") for i, x in enumerate(v))
            continue
        if isinstance(v, dict):
            for k, x in v.items():
                if not isinstance(k, str):
                    raise InvalidJob(f"{where}: {p or 'the value'} has the key {k!r} ({type(k).__name__}); JSON keys are strings")
                stack.append((x, f"{p}[{k!r}]" if p else k))
            continue
        raise InvalidJob(
            f"{where}: {p or 'the value'} is a {type(v).__module__}.{type(v).__qualname__} ({_short(v)}), which JSON cannot hold: "
            "pass str, int, float, bool, None, list or dict (e.g. a date as .isoformat())"
        )


def _short(v: Any) -> str:
    try:
        r = repr(v)
    except Exception:  # a repr that fails is no reason to hide the real error
        r = "?"
    return r if len(r) <= 60 else r[:57] + "..."


def dumps(value: Any, where: str, path: str = "", checked: bool = False, limit: bool = True) -> str:
    """JSON text for the database, checked first (check_json, unless the caller did) and, with
    limit, at most 1 MiB (a payload's cap; many jobs' JSON is sent whole and each payload is
    checked by the database)."""
    if not checked:
        check_json(value, where, path)
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    if "\\u0000" in text:
        raise InvalidJob(f"{where}: {path or 'the value'} holds a NUL character (\\u0000), which PostgreSQL's jsonb refuses")
    if limit and len(text) > PAYLOAD_MAX // 4 and len(text.encode()) > PAYLOAD_MAX:
        raise InvalidJob(f"{where}: {path or 'the value'} is {len(text.encode())} bytes of JSON; a payload is at most 1 MiB")
    return text


def timestamp(value: Union[_dt.datetime, str], what: str) -> str:
    """A timestamptz as text: an aware datetime, or text PostgreSQL reads (sent as it is)."""
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
            raise InvalidJob(f"{what}: {value!r} has no time zone; give an aware datetime (e.g. datetime.now(timezone.utc))")
        return value.isoformat()
    if isinstance(value, str):
        return value
    raise InvalidJob(f"{what}: {value!r} is not a datetime")
