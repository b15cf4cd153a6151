"""Engine log text as a person reads it: no ANSI colour codes, only the last state of a \\r-redrawn line."""

from __future__ import annotations

import re

ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def readable(raw: str) -> str:
    text = ANSI_RE.sub("", raw)
    if "\r" in text:  # tqdm-style progress bars redraw with \r: keep what was last on screen
        parts = [p for p in text.split("\r") if p.strip()]
        text = parts[-1] if parts else ""
    return text.rstrip()
