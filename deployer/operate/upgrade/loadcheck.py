"""The short load check of `deploy upgrade --apply`: a few sequential chat completions against the engine as the
target reaches it (the helper's HTTP, no tunnel), and the gates that compare the new release's numbers with the old
one's (profile `upgrade.gates`).

Time to first token is the median time of a one-token completion (non-streaming: what comes back first is the
whole answer); inter-token latency is the median of (time of a `max_tokens` completion - that) / (tokens - 1);
throughput is the output tokens of the long completions over their time. Pure apart from `measure`.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

from deployer.errors import Unhealthy
from deployer.profile.model import Profile, UpgradeGates
from deployer.remote.base import Remote
from deployer.remote.json_api import JsonCall, json_object

REQUEST_TIMEOUT_S = 120.0
PROMPT = "Count from one to fifty, in words, separated by commas."


@dataclass(frozen=True)
class LoadNumbers:
    """One release's numbers from the load check."""

    version: str | None
    ttft_ms: float
    itl_ms: float
    tokens_per_s: float
    requests: int
    tokens_per_request: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "ttft_ms": round(self.ttft_ms, 2), "itl_ms": round(self.itl_ms, 3),
                "tokens_per_s": round(self.tokens_per_s, 1), "requests": self.requests,
                "tokens_per_request": round(self.tokens_per_request, 1)}

    def line(self) -> str:
        return (f"{self.version or '?'}: TTFT {self.ttft_ms:.1f} ms, ITL {self.itl_ms:.2f} ms, "
                f"{self.tokens_per_s:.1f} tokens/s ({self.requests} requests)")


@dataclass(frozen=True)
class Gate:
    """One gate's verdict: the old and new values, the limit the new value is held to, passed or not."""

    name: str
    old: float
    new: float
    limit: float
    passed: bool

    def to_json(self) -> dict[str, Any]:
        return {"gate": self.name, "old": round(self.old, 3), "new": round(self.new, 3), "limit": round(self.limit, 3),
                "passed": self.passed}

    def line(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        return f"{self.name}: {self.old:.2f} -> {self.new:.2f} (limit {self.limit:.2f}) {verdict}"


def judge(old: LoadNumbers, new: LoadNumbers, gates: UpgradeGates) -> list[Gate]:
    """Each gate of `gates` on the two releases' numbers."""
    slack = gates.slack_ms
    out = []
    for name, before, after, ratio in (("ttft_ms", old.ttft_ms, new.ttft_ms, gates.ttft_ratio_max),
                                       ("itl_ms", old.itl_ms, new.itl_ms, gates.itl_ratio_max)):
        limit = max(before * ratio, before + slack)
        out.append(Gate(name, before, after, limit, after <= limit))
    # throughput: its ratio, or the time per request it means no worse than the slack
    floor = old.tokens_per_s * gates.throughput_ratio_min
    tokens = old.tokens_per_request or float(gates.max_tokens)
    per_request_old = tokens / old.tokens_per_s * 1000 if old.tokens_per_s > 0 else 0.0
    slack_floor = tokens * 1000 / (per_request_old + slack) if per_request_old + slack > 0 else 0.0
    limit = min(floor, slack_floor)
    out.append(Gate("tokens_per_s", old.tokens_per_s, new.tokens_per_s, limit, new.tokens_per_s >= limit))
    return out


def measure(remote: Remote, profile: Profile, gates: UpgradeGates, version: str | None) -> LoadNumbers:
    """The load check against the engine `profile` runs (release `version`); Unhealthy when it does not answer as
    an OpenAI server."""
    engine = profile.engine
    key = engine.args.get("api_key")
    headers = {"content-type": "application/json", **({"authorization": f"Bearer {key}"} if key else {})}
    model = _model_id(remote, profile, headers)
    first, each_token, tokens, seconds = [], [], 0, 0.0
    for _ in range(gates.requests):
        one, _ = _timed(remote, profile, headers, model, 1)
        full, got = _timed(remote, profile, headers, model, gates.max_tokens)
        first.append(one)
        each_token.append(max(full - one, 0.0) / max(got - 1, 1))
        tokens, seconds = tokens + got, seconds + full
    return LoadNumbers(version, statistics.median(first) * 1000, statistics.median(each_token) * 1000,
                       tokens / seconds if seconds > 0 else 0.0, gates.requests, tokens / gates.requests)


def _model_id(remote: Remote, profile: Profile, headers: dict[str, str]) -> str:
    reply = _reply(remote, profile, "GET", "/v1/models", None, headers)
    ids = [str(m.get("id")) for m in reply.get("data") or [] if isinstance(m, dict) and m.get("id")]
    if not ids:
        raise Unhealthy(f"load check: /v1/models on port {profile.engine.port} lists no model")
    return ids[0]


def _timed(remote: Remote, profile: Profile, headers: dict[str, str], model: str, max_tokens: int
           ) -> tuple[float, int]:
    """(seconds, output tokens) of one greedy chat completion."""
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens,
            "temperature": 0, "stream": False}
    started = time.monotonic()
    reply = _reply(remote, profile, "POST", "/v1/chat/completions", body, headers)
    took = time.monotonic() - started
    usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else {}
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return took, int(tokens) if isinstance(tokens, int) and tokens > 0 else max_tokens


def _reply(remote: Remote, profile: Profile, method: str, path: str, body: dict[str, Any] | None,
           headers: dict[str, str]) -> dict[str, Any]:
    engine = profile.engine
    call = JsonCall(engine.port, engine.probe_address, headers, REQUEST_TIMEOUT_S, what="load check: ")
    return json_object(remote, call, method, path, body)
