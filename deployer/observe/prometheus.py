"""The Prometheus text exposition format, as the real engines emit it, read into typed families; histogram
quantiles computed the way PromQL's `histogram_quantile` does; increases between two scrapes.

What is read (the text format 0.0.4 that prometheus_client writes for the engines, and the OpenMetrics
additions a newer client may write):

- `# HELP name text` (text unescaped: `\\\\` and `\\n`), `# TYPE name type`; `# UNIT`, `# EOF` and other comments
  are skipped (nothing after `# EOF` is read);
- samples `name{label="value",...} value [timestamp]`: label values unescaped (`\\\\`, `\\"`, `\\n`), a trailing
  comma allowed, a quoted metric name inside the braces (`{"a.b", x="1"}`) accepted; values `+Inf`, `-Inf`, `NaN`
  and Go floats; the timestamp kept as written (milliseconds since the epoch in the text format); an OpenMetrics
  exemplar (` # {...} v`) dropped;
- a sample belongs to the family whose TYPE/HELP came just before it when its name is the family's or the
  family's plus a suffix its type allows (`_total`, `_created`, `_bucket`, `_count`, `_sum`, `_info`, ...), else
  to the family of its own name (untyped when no TYPE named it). prometheus_client writes each `_created` series
  as a gauge family of its own: it is kept as such.

Quantiles follow Prometheus' promql/quantile.go `bucketQuantile`: buckets sorted by `le` and merged when equal,
counts forced monotonic; NaN when there are no observations, fewer than two buckets or no `+Inf` bucket; -Inf for
q < 0, +Inf for q > 1; linear interpolation inside the bucket holding the rank (a lower bound of 0 for the first
bucket when its bound is positive, else that bound); the upper bound of the second-highest bucket when the rank
falls into the `+Inf` bucket.

Increases follow PromQL's `increase()` per series, without its extrapolation: after - before, or the whole
after-value when the counter went down or its `_created` time changed (a restart: it counted up from 0 again);
a series that only the later scrape has counts from 0.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from deployer.errors import DeployError

Labels = tuple[tuple[str, str], ...]
"""A sample's labels, sorted by name (hashable: a series key)."""

LabelMatch = Mapping[str, "str | re.Pattern[str]"]
"""Label selectors: a string is PromQL's `=` (equal), a compiled pattern its `=~` (the whole value matches)."""


class MetricsUnreadable(DeployError):
    """A /metrics answer that is not the Prometheus text format; the message names the line."""


class MetricType(str, Enum):
    """A family's `# TYPE` (OpenMetrics' `unknown` is read as untyped)."""

    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"
    GAUGE_HISTOGRAM = "gaugehistogram"
    SUMMARY = "summary"
    INFO = "info"
    STATESET = "stateset"
    UNTYPED = "untyped"

    @classmethod
    def read(cls, word: str) -> MetricType:
        """The type a TYPE line names; unknown words are untyped."""
        try:
            return cls("untyped" if word == "unknown" else word)
        except ValueError:
            return cls.UNTYPED


SUFFIXES: Mapping[MetricType, tuple[str, ...]] = {
    MetricType.COUNTER: ("_total", "_created"),
    MetricType.HISTOGRAM: ("_bucket", "_count", "_sum", "_created"),
    MetricType.GAUGE_HISTOGRAM: ("_bucket", "_gcount", "_gsum"),
    MetricType.SUMMARY: ("_count", "_sum", "_created"),
    MetricType.INFO: ("_info",),
}
"""The sample names a family of each type may carry besides its own name."""


@dataclass(frozen=True)
class Sample:
    """One line of samples: name, labels, value and the timestamp as written (None when absent)."""

    name: str
    labels: Labels
    value: float
    timestamp: float | None = None

    def label(self, key: str) -> str | None:
        """The value of one label, None when the sample has no such label."""
        return dict(self.labels).get(key)

    def without(self, *keys: str) -> Labels:
        """The labels less the named ones (e.g. a bucket's series without its `le`)."""
        return tuple((k, v) for k, v in self.labels if k not in keys)

    def matches(self, match: LabelMatch) -> bool:
        """Whether every selector of `match` holds on this sample (a missing label reads as "")."""
        mine = dict(self.labels)
        return all(mine.get(k, "") == v if isinstance(v, str) else v.fullmatch(mine.get(k, "")) is not None
                   for k, v in match.items())


@dataclass(frozen=True)
class Family:
    """A metric family: its name as the TYPE/HELP lines give it, its type, help text and samples in order."""

    name: str
    type: MetricType
    help: str = ""
    samples: tuple[Sample, ...] = ()

    def owns(self, sample_name: str) -> bool:
        """Whether a sample of this name belongs to this family (its own name or one of its type's suffixes)."""
        return _owns(self.name, self.type, sample_name)


def _owns(family: str, type_: MetricType, sample_name: str) -> bool:
    if sample_name == family:
        return True
    return sample_name.startswith(family) and sample_name[len(family):] in SUFFIXES.get(type_, ())


@dataclass(frozen=True)
class Bucket:
    """One cumulative histogram bucket: observations <= upper (the `le` label)."""

    upper: float
    count: float


@dataclass(frozen=True)
class Histogram:
    """One histogram (a series, or several summed by `le`): cumulative buckets, count and sum."""

    buckets: tuple[Bucket, ...]
    count: float
    sum: float

    def quantile(self, q: float) -> float:
        """The q-quantile as PromQL's histogram_quantile gives it (NaN without observations)."""
        return histogram_quantile(q, self.buckets)

    def since(self, earlier: Histogram | None) -> Histogram:
        """The observations made after `earlier` (bucket by bucket); all of this one when there is no earlier
        histogram or the count went down (the engine restarted)."""
        if earlier is None or self.count < earlier.count:
            return self
        before = {b.upper: b.count for b in earlier.buckets}
        buckets = tuple(Bucket(b.upper, max(0.0, b.count - before.get(b.upper, 0.0))) for b in self.buckets)
        return Histogram(buckets, self.count - earlier.count, self.sum - earlier.sum)


@dataclass(frozen=True)
class Exposition:
    """One parsed /metrics answer: its families by name, in the order they came."""

    families: Mapping[str, Family] = field(default_factory=dict)

    def family(self, name: str) -> Family | None:
        """The family of this name, None when the engine does not expose it."""
        return self.families.get(name)

    def samples(self, name: str, match: LabelMatch | None = None) -> list[Sample]:
        """Every sample of this exact sample name (any family) whose labels match."""
        return [s for f in self.families.values() for s in f.samples
                if s.name == name and (match is None or s.matches(match))]

    def has(self, name: str) -> bool:
        """Whether any sample of this name (or histogram of this base name) is exposed."""
        return bool(self.samples(name) or self.samples(name + "_bucket"))

    def histogram(self, name: str, match: LabelMatch | None = None) -> Histogram | None:
        """The histogram `name` (its `_bucket`/`_count`/`_sum` samples), every matching series summed by `le`
        (PromQL's `sum by (le)`; a bucket without `le` is ignored, as PromQL does); None when it has no
        buckets here."""
        buckets = [s for s in self.samples(name + "_bucket", match) if s.label("le") is not None]
        if not buckets:
            return None
        by_le: dict[float, float] = {}
        for sample in buckets:
            upper = parse_value(sample.label("le") or "")
            by_le[upper] = by_le.get(upper, 0.0) + sample.value
        total = sum(s.value for s in self.samples(name + "_count", match))
        return Histogram(tuple(Bucket(u, c) for u, c in sorted(by_le.items())), total,
                         sum(s.value for s in self.samples(name + "_sum", match)))


@dataclass(frozen=True)
class Scrape:
    """One /metrics answer and the wall-clock time (Unix seconds) it was read at."""

    at: float
    exposition: Exposition


# -- parsing ----------------------------------------------------------------------------------------------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_QUOTED = r'"(?:[^"\\]|\\.)*"'
_NAME_RE = re.compile(_NAME)
_PAIR_RE = re.compile(rf'\s*({_NAME}|{_QUOTED})\s*=\s*({_QUOTED})\s*(,|\}})')
_BARE_NAME_RE = re.compile(rf"\s*({_QUOTED})\s*(,|\}})")
_CLOSE_RE = re.compile(r"\s*\}")
_ESCAPE_RE = re.compile(r"\\(.)")
_ESCAPES = {"n": "\n", "\\": "\\", '"': '"'}


def parse_value(text: str) -> float:
    """A sample value or `le`: Go's float syntax including `+Inf`, `-Inf` and `NaN`."""
    try:
        return float(text)
    except ValueError:
        raise MetricsUnreadable(f"not a number: {text!r}") from None


def _unescape(text: str) -> str:
    return _ESCAPE_RE.sub(lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), text)


def _unquote(text: str) -> str:
    return _unescape(text[1:-1]) if text.startswith('"') else text


def _labels(line: str, pos: int) -> tuple[str | None, Labels, int]:
    """The labels starting after the `{` at `pos - 1`: (a quoted metric name found inside, labels, end)."""
    name: str | None = None
    pairs: list[tuple[str, str]] = []
    if closed := _CLOSE_RE.match(line, pos):
        return None, (), closed.end()
    while True:
        if bare := _BARE_NAME_RE.match(line, pos):
            name, pos, sep = _unquote(bare.group(1)), bare.end(), bare.group(2)
        elif pair := _PAIR_RE.match(line, pos):
            pairs.append((_unquote(pair.group(1)), _unquote(pair.group(2))))
            pos, sep = pair.end(), pair.group(3)
        elif pairs and (closed := _CLOSE_RE.match(line, pos)):   # the trailing comma of `{a="1",}`
            return name, tuple(sorted(pairs)), closed.end()
        else:
            raise MetricsUnreadable(f"bad labels at column {pos + 1}: {line!r}")
        if sep == "}":
            return name, tuple(sorted(pairs)), pos


def parse_sample(line: str) -> Sample:
    """One sample line (no comment): name, labels, value, optional timestamp; an exemplar is dropped."""
    name: str | None = None
    labels: Labels = ()
    pos = 0
    line = line.strip()
    if matched := _NAME_RE.match(line):
        name, pos = matched.group(0), matched.end()
    if line.startswith("{", pos):
        inner, labels, pos = _labels(line, pos + 1)
        name = name or inner
    if not name:
        raise MetricsUnreadable(f"no metric name: {line!r}")
    rest = line[pos:].split(" # ", 1)[0].split()
    if not rest or len(rest) > 2 or (pos < len(line) and not line[pos].isspace()):
        raise MetricsUnreadable(f"expected `value [timestamp]` after the name: {line!r}")
    timestamp = parse_value(rest[1]) if len(rest) == 2 else None
    return Sample(name, labels, parse_value(rest[0]), timestamp)


@dataclass
class _Draft:
    """A family while its lines are read."""

    name: str
    type: MetricType = MetricType.UNTYPED
    help: str = ""
    samples: list[Sample] = field(default_factory=list)

    def owns(self, sample_name: str) -> bool:
        return _owns(self.name, self.type, sample_name)

    def done(self) -> Family:
        return Family(self.name, self.type, self.help, tuple(self.samples))


class _Reader:
    """Reads lines into families: the TYPE/HELP context, and where each sample goes."""

    def __init__(self) -> None:
        self.drafts: dict[str, _Draft] = {}
        self.current: _Draft | None = None

    def draft(self, name: str) -> _Draft:
        found = self.drafts.get(name)
        if found is None:
            found = self.drafts[name] = _Draft(name)
        return found

    def comment(self, line: str) -> bool:
        """Reads a `#` line; False at `# EOF` (stop reading)."""
        words = line[1:].split(None, 2)
        if words[:1] == ["EOF"]:
            return False
        if len(words) >= 2 and words[0] in ("HELP", "TYPE"):
            self.current = self.draft(words[1])
            text = words[2] if len(words) > 2 else ""
            if words[0] == "HELP":
                self.current.help = _unescape(text)
            else:
                self.current.type = MetricType.read(text.strip())
        return True

    def sample(self, sample: Sample) -> None:
        if self.current is None or not self.current.owns(sample.name):
            owner = next((d for d in self.drafts.values() if d.owns(sample.name)), None)
            self.current = owner or self.draft(sample.name)
        self.current.samples.append(sample)


def parse(text: str) -> Exposition:
    """Parses one /metrics answer; raises MetricsUnreadable naming the first line it cannot read."""
    reader = _Reader()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        try:
            if line.startswith("#"):
                if not reader.comment(line):
                    break
                continue
            reader.sample(parse_sample(line))
        except MetricsUnreadable as e:
            raise MetricsUnreadable(f"/metrics line {number}: {e.message}") from None
    return Exposition({name: d.done() for name, d in reader.drafts.items()})


# -- quantiles ------------------------------------------------------------------------------------------------


def _merged(buckets: Iterable[Bucket]) -> list[Bucket]:
    """Sorted by bound, equal bounds summed, counts forced monotonic (the envelope)."""
    merged: list[Bucket] = []
    for b in sorted(buckets, key=lambda b: b.upper):
        if merged and merged[-1].upper == b.upper:
            merged[-1] = Bucket(b.upper, merged[-1].count + b.count)
        else:
            merged.append(b)
    top = -math.inf
    out = []
    for b in merged:
        top = max(top, b.count)
        out.append(Bucket(b.upper, top))
    return out


def histogram_quantile(q: float, buckets: Sequence[Bucket]) -> float:
    """The q-quantile of cumulative buckets, as PromQL's histogram_quantile (see the module's docstring)."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    if not buckets or not math.isinf(max(b.upper for b in buckets)):
        return math.nan
    sorted_buckets = _merged(buckets)
    if len(sorted_buckets) < 2 or sorted_buckets[-1].count == 0:
        return math.nan
    rank = q * sorted_buckets[-1].count
    index = next(i for i, b in enumerate(sorted_buckets) if b.count >= rank or i == len(sorted_buckets) - 1)
    if index == len(sorted_buckets) - 1:
        return sorted_buckets[-2].upper
    if index == 0 and sorted_buckets[0].upper <= 0:
        return sorted_buckets[0].upper
    return _interpolate(sorted_buckets, index, rank)


def _interpolate(buckets: Sequence[Bucket], index: int, rank: float) -> float:
    start, below = (0.0, 0.0) if index == 0 else (buckets[index - 1].upper, buckets[index - 1].count)
    end, count = buckets[index].upper, buckets[index].count - below
    return start + (end - start) * ((rank - below) / count)


# -- increases ------------------------------------------------------------------------------------------------


def increase(before: float, after: float) -> float:
    """How much a counter grew: after - before, or all of `after` when it went down (a reset)."""
    return after if after < before else after - before


def _created_name(sample_name: str) -> str:
    return (sample_name[: -len("_total")] if sample_name.endswith("_total") else sample_name) + "_created"


def _series(exposition: Exposition, name: str, match: LabelMatch | None) -> dict[Labels, float]:
    return {s.labels: s.value for s in exposition.samples(name, match)}


def counter_increase(before: Exposition, after: Exposition, name: str,
                     match: LabelMatch | None = None) -> float | None:
    """The growth of counter `name` between two scrapes, summed over its matching series (resets handled, see
    the module's docstring); None when the later scrape does not expose it."""
    now = _series(after, name, match)
    if not now:
        return None
    then = _series(before, name, match)
    created_now = _series(after, _created_name(name), None)
    created_then = _series(before, _created_name(name), None)
    total = 0.0
    for labels, value in now.items():
        restarted = labels in created_then and created_now.get(labels, created_then[labels]) != created_then[labels]
        total += value if restarted or labels not in then else increase(then[labels], value)
    return total


def rate(before: Scrape, after: Scrape, name: str, match: LabelMatch | None = None) -> float | None:
    """Per-second growth of counter `name` between two scrapes; None when not exposed or no time passed."""
    seconds = after.at - before.at
    grown = counter_increase(before.exposition, after.exposition, name, match)
    if grown is None or seconds <= 0:
        return None
    return grown / seconds
