"""The query parameters of the dashboard's data routes, each checked before anything is asked: `BadQuery` (one
line, the server's 400) for a parameter that is unknown, given twice, or not what it must be.

- `key`: a row's key (`source.valid_key`), required.
- `offset`: a byte offset, ASCII digits only (not `²`, not `-1`), at most `MAX_OFFSET`.
- `max_bytes`: how much of the log to read, ASCII digits, at least 1; more than `MAX_LOG_BYTES` is read as
  `MAX_LOG_BYTES` (the limit, whatever is asked).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from urllib.parse import parse_qsl

from deployer.dashboard.model import LogRequest
from deployer.dashboard.source import MAX_LOG_BYTES, valid_key

MAX_OFFSET = 1 << 50               # 1 PiB: beyond any log; also exact in the page's JavaScript numbers
MAX_PARAMS = 8
_DIGITS = re.compile(r"[0-9]{1,16}")


class BadQuery(ValueError):
    """A query the dashboard refuses; `str()` is the one line it answers with (400)."""


def params(query: str, allowed: Collection[str]) -> dict[str, str]:
    """The query's parameters, each at most once and each one of `allowed`."""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, max_num_fields=MAX_PARAMS)
    except ValueError:
        raise BadQuery(f"more than {MAX_PARAMS} query parameters") from None
    found: dict[str, str] = {}
    for name, value in pairs:
        if name not in allowed:
            raise BadQuery(f"unknown query parameter {ascii(name[:40])} (known: {', '.join(sorted(allowed))})")
        if name in found:
            raise BadQuery(f"{name} is given twice")
        found[name] = value
    return found


def key_of(found: dict[str, str]) -> str:
    key = found.get("key")
    if key is None:
        raise BadQuery("key is required (a row's key, as the overview links it)")
    if not valid_key(key):
        raise BadQuery("key: not a row's key (letters, digits and ._@-, at most 128)")
    return key


def whole_number(found: dict[str, str], name: str, *, least: int = 0, most: int = MAX_OFFSET) -> int | None:
    """The parameter `name` as a whole number from `least` to `most` (None: not given)."""
    raw = found.get(name)
    if raw is None:
        return None
    if not _DIGITS.fullmatch(raw) or not least <= int(raw) <= most:
        raise BadQuery(f"{name}: expected a whole number from {least} to {most}, written in digits 0-9")
    return int(raw)


def log_request(found: dict[str, str]) -> LogRequest:
    """`offset` and `max_bytes` as a LogRequest, its size clamped to MAX_LOG_BYTES."""
    offset = whole_number(found, "offset")
    max_bytes = whole_number(found, "max_bytes", least=1)
    return LogRequest(offset=offset, max_bytes=min(max_bytes or LogRequest.max_bytes, MAX_LOG_BYTES))


__all__ = ["BadQuery", "MAX_OFFSET", "key_of", "log_request", "params", "whole_number"]
