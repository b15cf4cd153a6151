"""ServingMetrics: what one engine is doing, as one typed snapshot built from one or two /metrics scrapes and the
engine's metric-name map (deployer.observe.names).

The rules:

- a quantity the engine does not expose (no name in its map, or no candidate name in the scrape) is absent:
  None, and listed in `absent`; never 0;
- a counter family that is exposed but has no series matching the map's selectors counts 0 (prometheus_client
  makes a labelled series at its first increment: no `status_code="500"` series means no 500 yet); so does a
  counter whose map names a `zero_while` series that the scrape has (a counter first written at its first increment);
- gauges (running, waiting, KV usage) are read from the later scrape, their series combined as the map says;
- throughput (tokens/s) needs two scrapes: the counter's increase over the interval between them (resets
  handled), else None; preemptions and errors give their total and, with two scrapes, the interval's increase;
- a histogram with no series yet but a `zero_while` witness exposed has no observations (count 0), not absent;
- latency quantiles (p50, p99) come from the histogram's increase over the interval with two scrapes (PromQL's
  `histogram_quantile(q, sum by (le) (increase(x_bucket[interval])))`), from its whole life with one; with no
  observation in that window the quantiles are None but the histogram is not absent (count 0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from deployer.observe.names import Kind, MetricName, MetricNames, Quantity
from deployer.observe.prometheus import Exposition, Histogram, Scrape, counter_increase


class Window(str, Enum):
    """What observations a latency's quantiles are over."""

    INTERVAL = "interval"          # between the two scrapes
    SINCE_START = "since_start"    # the engine's whole life (one scrape)


@dataclass(frozen=True)
class Latency:
    """A latency histogram's p50 and p99 in seconds over a window; None when it had no observation."""

    p50_s: float | None
    p99_s: float | None
    count: float
    window: Window

    def to_json(self) -> dict[str, Any]:
        """Plain values (None stays null)."""
        return {"p50_s": self.p50_s, "p99_s": self.p99_s, "count": self.count, "window": self.window.value}


@dataclass(frozen=True)
class Count:
    """A counter: its total since the engine (re)started, and its increase over the interval (two scrapes)."""

    total: float
    in_interval: float | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain values (None stays null)."""
        return {"total": self.total, "in_interval": self.in_interval}


EMPTY = Histogram((), 0.0, 0.0)
"""A histogram with no series yet, read as no observations (a `zero_while` name whose witness is exposed)."""


@dataclass(frozen=True)
class _Reading:
    """The scrapes one snapshot is read from, and the engine's map."""

    names: MetricNames
    now: Exposition
    before: Exposition | None

    def exposed(self, quantity: Quantity) -> MetricName | None:
        """The first candidate name of a quantity that this scrape exposes (None: absent)."""
        for candidate in self.names.candidates(quantity):
            if self.now.has(candidate.name) or (candidate.zero_while and self.now.has(candidate.zero_while)):
                return candidate
        return None

    def gauge(self, quantity: Quantity) -> float | None:
        name = self.exposed(quantity)
        if name is None or name.kind is not Kind.GAUGE:
            return None
        values = [s.value for s in self.now.samples(name.name, name.selectors())]
        return name.aggregate.of(values) * name.scale if values else None

    def total(self, name: MetricName, exposition: Exposition) -> float:
        values = [s.value for s in exposition.samples(name.name, name.selectors())]
        return name.aggregate.of(values) * name.scale if values else 0.0

    def count(self, quantity: Quantity) -> Count | None:
        name = self.exposed(quantity)
        if name is None or name.kind is not Kind.COUNTER:
            return None
        grown = None
        if self.before is not None:
            grown = counter_increase(self.before, self.now, name.name, name.selectors())
            grown = (grown or 0.0) * name.scale
        return Count(self.total(name, self.now), grown)

    def histogram(self, quantity: Quantity) -> tuple[Histogram, Window] | None:
        name = self.exposed(quantity)
        if name is None or name.kind is not Kind.HISTOGRAM:
            return None
        now = self.now.histogram(name.name, name.selectors()) or (EMPTY if name.zero_while else None)
        if now is None:
            return None
        if self.before is None:
            return now, Window.SINCE_START
        return now.since(self.before.histogram(name.name, name.selectors())), Window.INTERVAL

    def latency(self, quantity: Quantity) -> Latency | None:
        found = self.histogram(quantity)
        if found is None:
            return None
        histogram, window = found
        return Latency(_finite(histogram.quantile(0.5)), _finite(histogram.quantile(0.99)), histogram.count, window)


def _finite(value: float) -> float | None:
    return None if math.isnan(value) or math.isinf(value) else value


def _per_second(count: Count | None, interval_s: float | None) -> float | None:
    if count is None or count.in_interval is None or not interval_s or interval_s <= 0:
        return None
    return count.in_interval / interval_s


LATENCIES = {Quantity.TIME_TO_FIRST_TOKEN: "TTFT", Quantity.INTER_TOKEN_LATENCY: "ITL", Quantity.E2E_LATENCY: "e2e"}


@dataclass(frozen=True)
class ServingMetrics:
    """One engine's serving state at `at` (Unix seconds); every field None when the engine does not expose it
    (then its quantity is in `absent`) or, for rates, when there was no interval to measure over."""

    engine: str
    release: str
    at: float
    interval_s: float | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_cache_usage: float | None = None              # fraction, 0..1
    prompt_tokens_per_s: float | None = None
    generation_tokens_per_s: float | None = None
    latency: Mapping[Quantity, Latency] = field(default_factory=dict)
    preemptions: Count | None = None
    request_errors: Count | None = None
    absent: tuple[Quantity, ...] = ()

    @classmethod
    def from_scrapes(cls, names: MetricNames, now: Scrape, before: Scrape | None = None) -> ServingMetrics:
        """The snapshot at `now`; rates and interval quantiles over the time since `before` when given."""
        reading = _Reading(names, now.exposition, before.exposition if before else None)
        interval = now.at - before.at if before is not None else None
        latency = {q: found for q in LATENCIES if (found := reading.latency(q)) is not None}
        return cls(
            engine=names.engine, release=names.release, at=now.at, interval_s=interval,
            requests_running=reading.gauge(Quantity.REQUESTS_RUNNING),
            requests_waiting=reading.gauge(Quantity.REQUESTS_WAITING),
            kv_cache_usage=reading.gauge(Quantity.KV_CACHE_USAGE),
            prompt_tokens_per_s=_per_second(reading.count(Quantity.PROMPT_TOKENS), interval),
            generation_tokens_per_s=_per_second(reading.count(Quantity.GENERATION_TOKENS), interval),
            latency=latency,
            preemptions=reading.count(Quantity.PREEMPTIONS),
            request_errors=reading.count(Quantity.REQUEST_ERRORS),
            absent=tuple(q for q in Quantity if reading.exposed(q) is None),
        )

    def to_json(self) -> dict[str, Any]:
        """Plain values for `--json`: absent quantities are null and listed under "absent"."""
        return {
            "engine": self.engine, "release": self.release, "at": self.at, "interval_s": self.interval_s,
            "requests_running": self.requests_running, "requests_waiting": self.requests_waiting,
            "kv_cache_usage": self.kv_cache_usage,
            "prompt_tokens_per_s": self.prompt_tokens_per_s,
            "generation_tokens_per_s": self.generation_tokens_per_s,
            **{q.value: (self.latency[q].to_json() if q in self.latency else None) for q in LATENCIES},
            "preemptions": self.preemptions.to_json() if self.preemptions else None,
            "request_errors": self.request_errors.to_json() if self.request_errors else None,
            "absent": [q.value for q in self.absent],
        }

    def summary(self) -> str:
        """One line for `status`: what is known, then what the engine does not expose."""
        parts = [p for p in (self._load(), self._throughput(), *self._latencies(), self._troubles()) if p]
        if self.absent:
            parts.append("not exposed: " + ", ".join(q.value for q in self.absent))
        return "; ".join(parts) or "no serving metrics"

    def _load(self) -> str:
        bits = []
        if self.requests_running is not None:
            bits.append(f"{self.requests_running:g} running")
        if self.requests_waiting is not None:
            bits.append(f"{self.requests_waiting:g} waiting")
        if self.kv_cache_usage is not None:
            bits.append(f"KV {self.kv_cache_usage * 100:.1f}%")
        return ", ".join(bits)

    def _throughput(self) -> str:
        bits = []
        if self.prompt_tokens_per_s is not None:
            bits.append(f"prompt {self.prompt_tokens_per_s:.1f} tok/s")
        if self.generation_tokens_per_s is not None:
            bits.append(f"generation {self.generation_tokens_per_s:.1f} tok/s")
        return ", ".join(bits)

    def _latencies(self) -> list[str]:
        out = []
        for quantity, label in LATENCIES.items():
            found = self.latency.get(quantity)
            if found is None:
                continue
            if found.p50_s is None or found.p99_s is None:
                out.append(f"{label} no requests")
            else:
                out.append(f"{label} p50 {seconds(found.p50_s)} p99 {seconds(found.p99_s)}")
        return out

    def _troubles(self) -> str:
        bits = []
        for label, count in (("preempted", self.preemptions), ("errors", self.request_errors)):
            if count is not None:
                recent = f" (+{count.in_interval:g})" if count.in_interval else ""
                bits.append(f"{label} {count.total:g}{recent}")
        return ", ".join(bits)


def seconds(value: float) -> str:
    """A latency for people: milliseconds below one second, else seconds."""
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"
