"""Engine log text as a person reads it, and as much of it as may be shown or stored.

`readable`: no escape or control sequences (colour, cursor moves, OSC titles and hyperlinks, bells, C1 codes,
bidirectional overrides and isolates), only
the last state of a \\r-redrawn line. `clip`, `clip_tail` and `clip_middle`: one excerpt of a line capped in size, saying how
much was cut. `bounded_diagnosis`: a diagnosis as it may go to the terminal, outcome.json and the history.
"""

from __future__ import annotations

import re
from typing import Any

ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# Everything a terminal would act on rather than print: CSI (colour included: log text is shown plain), OSC up to
# BEL or ST (or the end of the text when unterminated), DCS/SOS/PM/APC strings, other two-byte escapes, C1 codes
# and C0 controls other than tab and newline (CR too: a \r-redrawn line is read by `readable`), and the bidirectional
# controls (embeddings and overrides U+202A-202E, isolates U+2066-2069, the marks U+200E/200F) that would make a
# line read otherwise than it is (`deployer` shown as `reyolped`, a path's end moved to its start).
BIDI = "\u200e\u200f\u202a-\u202e\u2066-\u2069"
CONTROL_RE = re.compile(
    r"\x1b\[[0-9;?<=>!]*[ -/]*[@-~]?"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\|$)"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\|$)"
    r"|\x1b[ -/]*[0-~]?"
    r"|[\x00-\x08\x0b-\x1f\x7f\x80-\x9f" + BIDI + "]"
)

EXCERPT_CHARS = 500           # one log line quoted in output, outcome.json and history
TRACEBACK_CHARS = 32 << 10    # a traceback stored or shown with a diagnosis
EVIDENCE_LINES = 8


def printable(text: str) -> str:
    """Text safe to print on a terminal: every control sequence removed (newlines and tabs kept)."""
    return "\n".join(CONTROL_RE.sub("", part) for part in text.split("\n"))


def readable(raw: str) -> str:
    if "\r" in raw:  # tqdm-style progress bars redraw with \r: keep what was last on screen
        parts = [p for p in raw.split("\r") if CONTROL_RE.sub("", p).strip()]
        raw = parts[-1] if parts else ""
    return CONTROL_RE.sub("", raw).rstrip()


def clip(text: str, limit: int = EXCERPT_CHARS) -> str:
    """At most `limit` characters of the head of a line, with a note of how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]} ... [{len(text) - limit} more characters cut]"


def shown(value: Any, limit: int = 160) -> str:
    """Any value as one printable, clipped line of a report's text (a member's error, a note, a detail)."""
    return clip(printable(str(value)), limit)


def clip_tail(text: str, limit: int = EXCERPT_CHARS, head_missing: bool = False) -> str:
    """The end of an overlong line (where a progress bar or the last words are), noting what was cut before it;
    `head_missing`: the text is already only the end of a longer line."""
    over = max(len(text) - limit, 0)
    if not over and not head_missing:
        return text
    note = f"{over} characters cut" if not head_missing else \
        "start of line cut" + (f" and {over} more characters" if over else "")
    return f"[{note}] ... {text[-limit:]}"


def clip_middle(text: str, limit: int = EXCERPT_CHARS) -> str:
    """An overlong line by its head and its end (an engine's argument dump starts with its name, a progress line
    ends with its state), noting how much was cut between them."""
    over = len(text) - limit
    if over <= 0:
        return text
    half = limit // 2
    return f"{text[:half]} ... [{over} characters cut] ... {text[-(limit - half):]}"


def bounded_diagnosis(data: dict[str, Any]) -> dict[str, Any]:
    """A diagnosis's texts capped (summary, hint, evidence lines, traceback) so a hostile log cannot blow up what
    is printed or stored; the rest is kept as it is."""
    out = dict(data)
    for key in ("summary", "hint"):
        if isinstance(out.get(key), str):
            out[key] = clip(printable(out[key]))
    if isinstance(out.get("evidence"), list):
        out["evidence"] = [clip(printable(str(line))) for line in out["evidence"][:EVIDENCE_LINES]]
    if isinstance(out.get("traceback"), str):
        lines = [clip(line) for line in printable(out["traceback"]).split("\n")]
        text = "\n".join(lines)
        out["traceback"] = text if len(text) <= TRACEBACK_CHARS else \
            text[:TRACEBACK_CHARS] + f"\n... [{len(text) - TRACEBACK_CHARS} more characters of traceback cut]"
    return out


# A log line's time, engine-neutral: a date and time near the start of the line (`[2026-12-01 04:02:16]`,
# `2026-12-01T04:02:16.123`), else a month-day and time (`INFO 12-01 20:02:04`, the year being this one). Read as
# this machine's local time: engines log the target's local time, so keep both clocks on one zone (UTC) to compare.
_FULL_TIME_RE = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,6}))?")
_SHORT_TIME_RE = re.compile(r"(?<![\d-])(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,6}))?")
_TIME_AT_START = 80                       # characters: a time further in is the message's, not the line's
_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def line_time(line: str, now: float | None = None) -> float | None:
    """Epoch seconds of a log line's own timestamp, None when it has none (a traceback's line, a bare print)."""
    import time

    head = line[:_TIME_AT_START]
    full = _FULL_TIME_RE.search(head)
    if full:
        year, month, day, hh, mm, ss = (int(g) for g in full.groups()[:6])
        fraction = float(f"0.{full.group(7)}") if full.group(7) else 0.0
    else:
        short = _SHORT_TIME_RE.search(head)
        if not short:
            return None
        year = time.localtime(now).tm_year
        month, day, hh, mm, ss = (int(g) for g in short.groups()[:5])
        fraction = float(f"0.{short.group(6)}") if short.group(6) else 0.0
    try:
        return time.mktime((year, month, day, hh, mm, ss, 0, 0, -1)) + fraction
    except (OverflowError, ValueError):
        return None


def parse_since(text: str, now: float | None = None) -> float:
    """`--since`: a duration back from now (`90s`, `10m`, `2h`, `1d`) or a local date and time
    (`2026-12-01 04:02`, `2026-12-01T04:02:16`, a date alone); epoch seconds. Raises ValueError."""
    import time

    spoken = text.strip()
    found = _DURATION_RE.match(spoken)
    if found:
        return (time.time() if now is None else now) - float(found.group(1)) * _UNITS[found.group(2)]
    for shape in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M", "%Y-%m-%d"):
        try:
            return time.mktime(time.strptime(spoken, shape))
        except ValueError:
            continue
    raise ValueError(f"{text!r} is neither a duration (90s, 10m, 2h, 1d) nor a date and time (2026-12-01 04:02)")


def size_text(n: float) -> str:
    """Decimal units, as the hub and huggingface_hub's bars print sizes."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n:.0f} B"
