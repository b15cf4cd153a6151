"""Progress bars in engine output: tqdm's text (as huggingface_hub, hf_transfer through it, and the engines draw it)
read back into numbers, so a download shows file, percent, bytes and rate, and a frozen bar can be told from a
moving one.

The forms, from tqdm's `format_meter` (bar_format None; `unit_scale=True` prints n and total with an SI prefix
and no unit, the unit only in the rate):

    {desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]
    {desc}: {n_fmt}{unit} [{elapsed}, {rate_fmt}{postfix}]                               (total unknown)
    {desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [...]                      (engines' weight loading)

huggingface_hub's file downloads: `tqdm(unit="B", unit_scale=True, desc=<file name, "(…)" + its last 40
characters when longer>)`; with hf_transfer the same bar is driven by hf_transfer's callback; `snapshot_download`
adds "Fetching N files" counted in files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18, "Z": 1e21, "Y": 1e24}
_NUM = r"[0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?[kKMGTPEZY]?"
_RATE = r"(?P<rate>(?:[0-9.]+|\?)[kKMGTPEZY]?[^\s/\],]*/s|[0-9.]+[kKMGTPEZY]?s/[^\s\],]+)"
WITH_TOTAL = re.compile(
    r"^(?:(?P<desc>.*?):\s*)?(?P<pct>[0-9]{1,3})%(?:\|[^|]*\||\s*Completed\s*\|)\s*"
    rf"(?P<n>{_NUM})/(?P<total>{_NUM})\s*\[(?P<elapsed>[0-9:]+)<(?P<remaining>[0-9:?]+)(?:,\s*{_RATE})?")
NO_TOTAL = re.compile(
    rf"^(?P<desc>.*?):\s*(?P<n>{_NUM})(?P<unit>[^\s\[]*)\s*\[(?P<elapsed>[0-9:]+)(?:,\s*{_RATE})?\]")
RATE_PARTS = re.compile(r"^(?P<num>[0-9.]+|\?)(?P<prefix>[kKMGTPEZY]?)(?P<unit>[^/]*)/s$")
INVERSE_RATE = re.compile(r"^(?P<num>[0-9.]+)(?P<prefix>[kKMGTPEZY]?)s/(?P<unit>.+)$")
FETCHING = re.compile(r"^Fetching [0-9]+ files?$")
MAX_BAR_CHARS = 1000          # a bar is one screen line; anything longer is not one (and is not worth a regex)


@dataclass(frozen=True)
class Bar:
    """One state of a progress bar."""

    desc: str
    n: float
    total: float | None
    percent: int | None
    unit: str                 # "B" for bytes, "it" or what the bar counts
    rate: float | None        # units per second (None: unknown yet)
    text: str

    @property
    def is_bytes(self) -> bool:
        return self.unit == "B"

    @property
    def is_download(self) -> bool:
        """A file transfer (bytes), or huggingface_hub's "Fetching N files"."""
        return self.is_bytes or bool(FETCHING.match(self.desc)) or self.desc.startswith("Downloading")

    @property
    def file(self) -> str:
        name = self.desc.strip()
        return name[len("Downloading "):] if name.startswith("Downloading ") else name

    def position(self) -> tuple[str, float]:
        """What must change for the bar to have moved (its text also shows the clock, which a redraw advances)."""
        return self.desc, self.n


def number(text: str) -> float:
    """tqdm's `format_sizeof` read back: "1.65G" -> 1.65e9."""
    if text and text[-1] in PREFIX:
        return float(text[:-1]) * PREFIX[text[-1]]
    return float(text)


def _rate(text: str | None) -> tuple[float | None, str | None]:
    """A rate_fmt as (units per second, unit): "134MB/s" -> (1.34e8, "B"); "5.15s/it" -> (0.194, "it")."""
    if not text:
        return None, None
    found = RATE_PARTS.match(text)
    if found:
        value = None if found["num"] == "?" else float(found["num"]) * PREFIX[found["prefix"]]
        return value, found["unit"] or None
    found = INVERSE_RATE.match(text)
    if found:
        seconds = float(found["num"]) * PREFIX[found["prefix"]]
        return (1.0 / seconds if seconds else None), found["unit"]
    return None, None


def parse(line: str) -> Bar | None:
    """The bar a (readable) line shows, or None when it is not a tqdm bar."""
    if len(line) > MAX_BAR_CHARS or "[" not in line or ":" not in line and "%" not in line:
        return None
    found = WITH_TOTAL.match(line)
    try:
        if found:
            rate, unit = _rate(found["rate"])
            return Bar(found["desc"] or "", number(found["n"]), number(found["total"]), int(found["pct"]),
                       unit or "it", rate, line)
        found = NO_TOTAL.match(line)
        if found:
            rate, unit = _rate(found["rate"])
            return Bar(found["desc"], number(found["n"]), None, None, unit or found["unit"] or "it", rate, line)
    except ValueError:
        return None
    return None


def human_bytes(value: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1000
    return f"{value:.2f} TB"  # pragma: no cover


def describe(bar: Bar) -> str:
    """One short line for people: file, percent, done/total, rate."""
    parts = [bar.file or "download"]
    if bar.percent is not None:
        parts.append(f"{bar.percent}%")
    if bar.is_bytes:
        done = human_bytes(bar.n) + (f" of {human_bytes(bar.total)}" if bar.total else "")
        parts.append(done)
        if bar.rate is not None:
            parts.append(f"{human_bytes(bar.rate)}/s")
    else:
        parts.append(f"{bar.n:g}" + (f"/{bar.total:g}" if bar.total else "") + f" {bar.unit}")
    return "  ".join(parts)
