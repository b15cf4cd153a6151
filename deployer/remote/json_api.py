"""`json_object`: one request to an engine's (or router's) OpenAI-style JSON API as the target reaches it (the
transport's `request`: the helper's HTTP, no tunnel), its answer a JSON object or `Unhealthy` saying why not. Shared
by the smoke test and the upgrade's load check, which must judge an answer the same way."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from deployer.errors import Unhealthy
from deployer.remote.base import EndpointUnreachable, Remote


@dataclass(frozen=True)
class JsonCall:
    """Where a JSON request goes (port and address as the target reaches them) and what it carries."""

    port: int
    address: str
    headers: dict[str, str]
    timeout: float
    what: str = ""  # a prefix for every error line, e.g. "load check: "


def json_object(remote: Remote, call: JsonCall, method: str, path: str, body: dict[str, Any] | None
                ) -> dict[str, Any]:
    """The JSON object `method path` answers with (HTTP 200); Unhealthy for no answer, another status, or a body
    that is not a JSON object."""
    data = None if body is None else json.dumps(body).encode()
    headers = {**call.headers, **({"content-type": "application/json"} if data is not None else {})}
    where = f"{call.what}{method} {path}"
    try:
        reply = remote.request(method, call.port, path, body=data, headers=headers, timeout=call.timeout,
                               address=call.address)
    except EndpointUnreachable as exc:
        raise Unhealthy(f"{where}: {exc}") from None
    if reply.status != 200:
        raise Unhealthy(f"{where} answered HTTP {reply.status}: {reply.body[:200].decode('utf-8', 'replace')}")
    try:
        parsed = json.loads(reply.body)
    except ValueError:
        raise Unhealthy(f"{where} answered something that is not JSON: {reply.body[:200]!r}") from None
    if not isinstance(parsed, dict):
        raise Unhealthy(f"{where} answered JSON that is not an object: {reply.body[:200]!r}")
    return parsed
