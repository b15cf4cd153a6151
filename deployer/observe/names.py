"""The metric-name map of an engine: which Prometheus series answers each serving quantity, read from the
engine's own data file (deployer/engines/<kind>/metrics.yaml), each name with the release it was read from.

A file looks like:

    engine: myengine
    release: 0.32.0                      # the release the names were read from (source and /metrics capture)
    metrics:
      requests_running:                  # a Quantity; a list of candidates is tried in order (renames)
        name: "myengine:num_running"     # the sample name as exposed (counters with their `_total`)
        kind: gauge                      # gauge | counter | histogram (a histogram's base name)
        release: 0.32.0
        also_in: [0.33.0]                # optional: other releases checked to declare the same name
        source: myengine/metrics.py:528  # the file:line of that release that declares it
        match: {finished_reason: error}  # optional: label selectors, a value `~regex` is PromQL's =~
        aggregate: sum                   # optional: how series are combined (sum, max); default sum
        scale: 1.0                       # optional: multiplier to the documented unit (fraction, seconds)
        zero_while: other:name           # optional: a counter/histogram with no series before its first
                                         # increment reads 0 while this other series is exposed
    switch:                              # optional: the flag without which (or with which) /metrics lacks
      flag: enable_metrics               # these series; on_when_set: true = served only with it set true
      on_when_set: true
      fix: "add `enable_metrics: true` to engine.args"
      source: myengine/server.py:314

A quantity the file does not name is one the engine does not expose: it stays absent (None), never 0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from deployer.errors import DeployError
from deployer.observe.prometheus import LabelMatch


def _text(value: Any) -> Any:
    """A release YAML read as a number (`0.5`) back to its text."""
    return str(value) if isinstance(value, (int, float)) else value


class MetricNamesUnreadable(DeployError):
    """An engine's metrics.yaml that does not load or validate; the message names the file."""


class Quantity(str, Enum):
    """What ServingMetrics reports, each in one documented unit."""

    REQUESTS_RUNNING = "requests_running"          # requests in the running batch (count)
    REQUESTS_WAITING = "requests_waiting"          # requests queued, not yet scheduled (count)
    KV_CACHE_USAGE = "kv_cache_usage"              # fraction of the KV cache in use, 0..1
    PROMPT_TOKENS = "prompt_tokens"                # prompt (prefill) tokens processed (counter)
    GENERATION_TOKENS = "generation_tokens"        # tokens generated (counter)
    TIME_TO_FIRST_TOKEN = "time_to_first_token"    # seconds (histogram)
    INTER_TOKEN_LATENCY = "inter_token_latency"    # seconds between two output tokens (histogram)
    E2E_LATENCY = "e2e_latency"                    # seconds from arrival to the last token (histogram)
    PREEMPTIONS = "preemptions"                    # requests preempted / retracted (counter)
    REQUEST_ERRORS = "request_errors"              # requests that ended in an engine error (counter)


class Kind(str, Enum):
    """The Prometheus type a name is read as."""

    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"


class Aggregate(str, Enum):
    """How the matching series of one name (engines, ranks, models) are combined."""

    SUM = "sum"
    MAX = "max"

    def of(self, values: list[float]) -> float:
        """The combined value of several series (callers never pass an empty list)."""
        return max(values) if self is Aggregate.MAX else sum(values)


class MetricName(BaseModel):
    """One series that answers a quantity, with where it was read."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    kind: Kind
    release: str
    source: str
    also_in: list[str] = Field(default_factory=list)
    match: dict[str, str] = Field(default_factory=dict)
    aggregate: Aggregate = Aggregate.SUM
    scale: float = 1.0
    zero_while: str | None = None

    @field_validator("release", mode="before")
    @classmethod
    def _release_text(cls, value: Any) -> Any:
        return _text(value)

    @field_validator("also_in", mode="before")
    @classmethod
    def _releases_text(cls, value: Any) -> Any:
        return [_text(v) for v in value] if isinstance(value, list) else value

    def selectors(self) -> LabelMatch:
        """The label selectors: `~regex` values as compiled patterns (whole value), others equal."""
        return {k: re.compile(v[1:]) if v.startswith("~") else v for k, v in self.match.items()}


class MetricsSwitch(BaseModel):
    """The engine flag that decides whether its /metrics carries its series: they are served when the flag is set
    true (`on_when_set`), or when it is not (a flag that turns them off)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    flag: str                  # the profile key (engine.args)
    on_when_set: bool
    fix: str                   # what to change in the profile, as a warning says it
    source: str                # the file:line of the release that decides it

    def serves(self, args: Mapping[str, Any]) -> bool:
        """Whether an engine started with these profile args serves its series."""
        return (args.get(self.flag) is True) == self.on_when_set


class MetricNames(BaseModel):
    """An engine's map: quantity -> candidate names, in the order they are tried; and the flag that switches its
    metrics on or off, if any."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: str
    release: str
    metrics: dict[Quantity, list[MetricName]]
    switch: MetricsSwitch | None = None

    @field_validator("release", mode="before")
    @classmethod
    def _release_text(cls, value: Any) -> Any:
        return _text(value)

    @field_validator("metrics", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: v if isinstance(v, list) else [v] for k, v in value.items()}
        return value

    def candidates(self, quantity: Quantity) -> list[MetricName]:
        """The names tried for a quantity (empty: the engine does not expose it)."""
        return self.metrics.get(quantity, [])


def load_metric_names(path: Path) -> MetricNames:
    """Loads and validates one engine's metrics.yaml; raises MetricNamesUnreadable naming the file."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        return MetricNames.model_validate(data)
    except (OSError, yaml.YAMLError, ValidationError) as e:
        raise MetricNamesUnreadable(f"{path}: {e}") from None
