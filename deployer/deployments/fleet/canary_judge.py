"""The canary's verdict: one replica's serving numbers over a window against the other replicas', and the gates.

Pure. The numbers of each replica come from two /metrics scrapes (deployer.observe.serving: the interval's
histograms and counter increases); the others' are pooled into one baseline: their error rate over all their
requests, the median of their p99s, the mean of their tokens/s. Each gate is a `Check` with both numbers and the
limit; a quantity one side does not expose (or saw no observation of) is not compared, and says so. Too little
traffic to judge (fewer than `min_requests` on the canary or on the others together) is a roll-back: a canary is
promoted only on evidence.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Literal

from deployer.observe.names import Quantity
from deployer.observe.serving import ServingMetrics
from deployer.profile.model import Canary

Decision = Literal["promote", "roll-back"]


@dataclass(frozen=True)
class WindowNumbers:
    """What one replica served over the window (None: not exposed, or no observation in the window)."""

    replica: int
    requests: float                   # answered (the end-to-end histogram's count) plus 5xx answers
    errors: float | None              # 5xx answers of the inference endpoints
    ttft_p99_s: float | None
    itl_p99_s: float | None
    tokens_per_s: float | None        # generated tokens per second

    @property
    def error_rate(self) -> float | None:
        if self.errors is None:
            return None
        return self.errors / self.requests if self.requests > 0 else 0.0

    @classmethod
    def of(cls, replica: int, metrics: ServingMetrics) -> WindowNumbers:
        """From a snapshot over the window (two scrapes)."""
        errors = metrics.request_errors.in_interval if metrics.request_errors is not None else None
        e2e = metrics.latency.get(Quantity.E2E_LATENCY)
        ttft = metrics.latency.get(Quantity.TIME_TO_FIRST_TOKEN)
        itl = metrics.latency.get(Quantity.INTER_TOKEN_LATENCY)
        answered = e2e.count if e2e is not None else ttft.count if ttft is not None else 0.0
        return cls(replica, answered + (errors or 0.0), errors, ttft.p99_s if ttft else None,
                   itl.p99_s if itl else None, metrics.generation_tokens_per_s)


@dataclass(frozen=True)
class Check:
    """One gate: the canary's number, the baseline's, what was compared and the limit; `passed` None: not
    compared (`note` says why)."""

    name: str                         # traffic | error_rate | ttft_p99 | itl_p99 | tokens_per_s
    canary: float | None
    baseline: float | None
    value: float | None               # the compared quantity: a difference (error_rate), a ratio, a count (traffic)
    limit: float
    passed: bool | None
    note: str = ""

    def line(self) -> str:
        """How the output and the history say it."""
        if self.passed is None:
            return f"{self.name}: not compared ({self.note})"
        verdict = "ok" if self.passed else "FAILED"
        return f"{self.name}: {verdict} ({self.note})"


@dataclass(frozen=True)
class Verdict:
    """The decision, why, and every check with its numbers."""

    decision: Decision
    window_s: float
    canary: WindowNumbers
    baseline: list[WindowNumbers]
    checks: list[Check] = field(default_factory=list)

    @property
    def reasons(self) -> list[str]:
        failed = [c.line() for c in self.checks if c.passed is False]
        return failed or ["every gate passed: " + "; ".join(c.line() for c in self.checks if c.passed)]

    def headline(self) -> str:
        """One short line: the decision and which gates failed."""
        word = "promoted" if self.decision == "promote" else "rolled back"
        failed = [c.name for c in self.checks if c.passed is False]
        why = f"{', '.join(failed)} failed" if failed else "every gate passed"
        return f"canary r{self.canary.replica} {word} after {self.window_s:g}s: {why}"

    def summary(self) -> str:
        word = "promoted" if self.decision == "promote" else "rolled back"
        return f"canary r{self.canary.replica} {word} after {self.window_s:g}s: " + "; ".join(self.reasons)


def judge(canary: WindowNumbers, others: list[WindowNumbers], gates: Canary, window_s: float) -> Verdict:
    """Promote when there was enough traffic and no gate failed; else roll back."""
    traffic = _traffic(canary, others, gates)
    checks = [traffic]
    if traffic.passed:
        checks += [_error_rate(canary, others, gates), _ratio("ttft_p99", canary.ttft_p99_s,
                                                               _median([o.ttft_p99_s for o in others]),
                                                               gates.max_p99_ratio, upper=True),
                   _ratio("itl_p99", canary.itl_p99_s, _median([o.itl_p99_s for o in others]),
                          gates.max_p99_ratio, upper=True),
                   _ratio("tokens_per_s", canary.tokens_per_s, _mean([o.tokens_per_s for o in others]),
                          gates.min_tokens_per_s_ratio, upper=False)]
    decision: Decision = "promote" if all(c.passed is not False for c in checks) else "roll-back"
    return Verdict(decision, window_s, canary, list(others), checks)


def _traffic(canary: WindowNumbers, others: list[WindowNumbers], gates: Canary) -> Check:
    pooled = sum(o.requests for o in others)
    enough = canary.requests >= gates.min_requests and pooled >= gates.min_requests
    note = (f"canary {canary.requests:g} requests, the others {pooled:g}; at least {gates.min_requests} each "
            "(rollout.canary.min_requests)")
    if not others:
        return Check("traffic", canary.requests, None, canary.requests, gates.min_requests, False,
                     "no other replica to compare with")
    return Check("traffic", canary.requests, pooled, min(canary.requests, pooled), gates.min_requests, enough, note)


def _error_rate(canary: WindowNumbers, others: list[WindowNumbers], gates: Canary) -> Check:
    limit = gates.max_error_rate_delta
    counted = [o for o in others if o.errors is not None]
    if canary.error_rate is None or not counted:
        return Check("error_rate", canary.error_rate, None, None, limit, None, "5xx answers not exposed")
    requests = sum(o.requests for o in counted)
    base = sum(o.errors or 0.0 for o in counted) / requests if requests > 0 else 0.0
    delta = canary.error_rate - base
    return Check("error_rate", canary.error_rate, base, delta, limit, delta <= limit,
                 f"canary {canary.error_rate:.2%}, the others {base:.2%}: {delta * 100:+.2f} points, "
                 f"at most {limit * 100:+.2f} (rollout.canary.max_error_rate_delta)")


def _ratio(name: str, mine: float | None, base: float | None, limit: float, *, upper: bool) -> Check:
    """canary / baseline against `limit`: at most it (upper) or at least it."""
    if mine is None or base is None or base <= 0:
        side = "the canary" if mine is None else "the others"
        return Check(name, mine, base, None, limit, None, f"no observation on {side} in the window")
    ratio = mine / base
    passed = ratio <= limit if upper else ratio >= limit
    unit = "s" if name != "tokens_per_s" else " tok/s"
    gate = "max_p99_ratio" if upper else "min_tokens_per_s_ratio"
    return Check(name, mine, base, ratio, limit, passed,
                 f"canary {mine:.4g}{unit}, the others {base:.4g}{unit}: x{ratio:.2f}, "
                 f"{'at most' if upper else 'at least'} x{limit:g} (rollout.canary.{gate})")


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None
