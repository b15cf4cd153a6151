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
    progress:                            # optional: series that advance on every engine step (forward
      - name: "myengine:steps_total"     # progress: the supervisor's hang rule), same keys as a metric
        kind: counter
        release: 0.32.0
        source: myengine/metrics.py:700
    engine_labels: [engine]              # optional: the labels that tell one data-parallel engine's series from
                                         # another's (the hang rule judges each engine alone)
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
from dataclasses import MISSING, dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import yaml

from deployer.errors import DeployError
from deployer.observe.prometheus import LabelMatch

# Checked by hand, not by pydantic: `deploy status` and `top` read these maps, and pydantic's import was a third of
# their start-up (issue 36's bench).


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


T = TypeVar("T")


class _Invalid(ValueError):
    """A value of a metrics.yaml that is not what its key takes."""


def _str(value: Any, key: str) -> str:
    value = _text(value)
    if not isinstance(value, str):
        raise _Invalid(f"{key}: a string, not {value!r}")
    return value


def _strs(value: Any, key: str) -> list[str]:
    if not isinstance(value, list):
        raise _Invalid(f"{key}: a list, not {value!r}")
    return [_str(v, key) for v in value]


def _mapping(value: Any, key: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _Invalid(f"{key}: a mapping, not {value!r}")
    return {str(k): v for k, v in value.items()}


def _choice(kind: type[T], value: Any, key: str) -> T:
    try:
        return kind(value)  # type: ignore[call-arg]
    except ValueError:
        raise _Invalid(f"{key}: {value!r} is not one of {[m.value for m in kind]}") from None  # type: ignore[attr-defined]


def _keys(data: Any, cls: type, where: str) -> Mapping[str, Any]:
    """DATA as the mapping of CLS's fields: no unknown key, every field without a default there."""
    found = _mapping(data, where)
    known = {f.name: f for f in fields(cls)}
    extra = sorted(set(found) - set(known))
    if extra:
        raise _Invalid(f"{where}: unknown keys {extra}")
    missing = [n for n, f in known.items() if n not in found and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise _Invalid(f"{where}: missing keys {missing}")
    return found


@dataclass(frozen=True)
class MetricName:
    """One series that answers a quantity, with where it was read."""

    name: str
    kind: Kind
    release: str
    source: str
    also_in: list[str] = field(default_factory=list)
    match: dict[str, str] = field(default_factory=dict)
    aggregate: Aggregate = Aggregate.SUM
    scale: float = 1.0
    zero_while: str | None = None

    @classmethod
    def of(cls, data: Any, where: str) -> MetricName:
        d = _keys(data, cls, where)
        scale = d.get("scale", 1.0)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise _Invalid(f"{where}.scale: a number, not {scale!r}")
        zero_while = d.get("zero_while")
        return cls(_str(d["name"], f"{where}.name"), _choice(Kind, d["kind"], f"{where}.kind"),
                   _str(d["release"], f"{where}.release"), _str(d["source"], f"{where}.source"),
                   _strs(d.get("also_in", []), f"{where}.also_in"),
                   {str(k): _str(v, f"{where}.match") for k, v in _mapping(d.get("match", {}), where).items()},
                   _choice(Aggregate, d.get("aggregate", "sum"), f"{where}.aggregate"), float(scale),
                   None if zero_while is None else _str(zero_while, f"{where}.zero_while"))

    def selectors(self) -> LabelMatch:
        """The label selectors: `~regex` values as compiled patterns (whole value), others equal."""
        return {k: re.compile(v[1:]) if v.startswith("~") else v for k, v in self.match.items()}


@dataclass(frozen=True)
class MetricsSwitch:
    """The engine flag that decides whether its /metrics carries its series: they are served when the flag is set
    true (`on_when_set`), or when it is not (a flag that turns them off)."""

    flag: str                  # the profile key (engine.args)
    on_when_set: bool
    fix: str                   # what to change in the profile, as a warning says it
    source: str                # the file:line of the release that decides it

    @classmethod
    def of(cls, data: Any, where: str) -> MetricsSwitch:
        d = _keys(data, cls, where)
        if not isinstance(d["on_when_set"], bool):
            raise _Invalid(f"{where}.on_when_set: true or false, not {d['on_when_set']!r}")
        return cls(_str(d["flag"], f"{where}.flag"), d["on_when_set"], _str(d["fix"], f"{where}.fix"),
                   _str(d["source"], f"{where}.source"))

    def serves(self, args: Mapping[str, Any]) -> bool:
        """Whether an engine started with these profile args serves its series."""
        return (args.get(self.flag) is True) == self.on_when_set


@dataclass(frozen=True)
class MetricNames:
    """An engine's map: quantity -> candidate names, in the order they are tried; and the flag that switches its
    metrics on or off, if any."""

    engine: str
    release: str
    metrics: dict[Quantity, list[MetricName]]
    switch: MetricsSwitch | None = None
    progress: list[MetricName] = field(default_factory=list)  # advance on every engine step (the hang rule)
    engine_labels: list[str] = field(default_factory=list)  # tell one data-parallel engine's series from another's

    @classmethod
    def of(cls, data: Any) -> MetricNames:
        d = _keys(data, cls, "the file")
        metrics: dict[Quantity, list[MetricName]] = {}
        for key, value in _mapping(d["metrics"], "metrics").items():
            quantity = _choice(Quantity, key, "metrics")
            metrics[quantity] = [MetricName.of(one, f"metrics.{key}")
                                 for one in (value if isinstance(value, list) else [value])]
        switch = d.get("switch")
        progress = d.get("progress", [])
        return cls(_str(d["engine"], "engine"), _str(d["release"], "release"), metrics,
                   None if switch is None else MetricsSwitch.of(switch, "switch"),
                   [MetricName.of(one, "progress") for one in (progress if isinstance(progress, list) else [progress])],
                   _strs(d.get("engine_labels", []), "engine_labels"))

    def candidates(self, quantity: Quantity) -> list[MetricName]:
        """The names tried for a quantity (empty: the engine does not expose it)."""
        return self.metrics.get(quantity, [])


SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, where PyYAML was built with it


def load_metric_names(path: Path) -> MetricNames:
    """Loads and validates one engine's metrics.yaml; raises MetricNamesUnreadable naming the file."""
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=SAFE_LOADER)  # noqa: S506 - a safe loader
        return MetricNames.of(data)
    except (OSError, yaml.YAMLError, _Invalid) as e:
        raise MetricNamesUnreadable(f"{path}: {e}") from None
