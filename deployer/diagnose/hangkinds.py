"""The engine-neutral hang signatures (engines/common/hangs.yaml) and what a hang's record shows: the stacks a hung
engine's supervisor took (supervisor/stacks.py) classified as a collective wait, a lock, a blocking call,
the GIL or a stopped process, and the one-line summary `status` and `history` print. Light (yaml and re only):
the on-call reads import it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import yaml

from deployer.engines import common
from deployer.logtext import clip

HANGS_FILE = common.DATA_DIR / "hangs.yaml"
TOP_SHOWN = 6


@dataclass(frozen=True)
class HangKind:
    """One engine-neutral signature of what a hung engine waits on."""

    kind: str
    summary: str
    hint: str
    patterns: tuple[re.Pattern[str], ...]

    def matches(self, lines: list[str]) -> str | None:
        """The first line that matches (None: none)."""
        for line in lines:
            if any(p.search(line) for p in self.patterns):
                return line
        return None


@lru_cache(maxsize=1)
def hang_kinds() -> tuple[HangKind, ...]:
    """hangs.yaml's kinds, in file order."""
    data = yaml.safe_load(HANGS_FILE.read_text(encoding="utf-8")) or {}
    return tuple(HangKind(str(k["kind"]), str(k["summary"]), str(k.get("hint") or ""),
                          tuple(re.compile(str(p), re.IGNORECASE) for p in k["patterns"]))
                 for k in data.get("kinds", []))


def top_lines(stacks: Mapping[str, Any] | None) -> list[str]:
    """Every process's top frames, each prefixed with its pid."""
    out: list[str] = []
    for proc in (stacks or {}).get("processes") or []:
        if isinstance(proc, Mapping):
            out.extend(f"pid {proc.get('pid')}: {line}" for line in proc.get("top") or [] if isinstance(line, str))
    return out


def main_lines(stacks: Mapping[str, Any] | None) -> list[str]:
    """What each process's main thread waits on: the kernel's line for the process and the frames of its main
    thread (py-spy's "MainThread", the kernel's thread whose id is the pid), each prefixed with its pid. Helper
    threads idle on an Event or a queue in every healthy engine (an engine's watchdogs, tqdm's monitor: a real
    capture, tests/cases/hangs/): their frames say nothing of a hang."""
    out: list[str] = []
    for proc in (stacks or {}).get("processes") or []:
        if not isinstance(proc, Mapping):
            continue
        pid, main = proc.get("pid"), False
        for line in proc.get("top") or []:
            if not isinstance(line, str):
                continue
            if line.startswith("Thread "):
                main = line.endswith('"MainThread"') or line.startswith(f"Thread {pid} (")
                continue
            if line.startswith("Process ") or (main and line.startswith(" ")):
                out.append(f"pid {pid}: {line}")
    return out


def classify(stacks: Mapping[str, Any] | None) -> tuple[HangKind, str] | None:
    """The kind of hang the main threads of the stacks show and the line that says so; None when no signature
    matches."""
    lines = main_lines(stacks)
    for kind in hang_kinds():
        line = kind.matches(lines)
        if line is not None:
            return kind, line
    return None


def hung_summary(end: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What `history` and `status` show of a hang (`end`: state.json's last_crash or state): when, the progress
    seen, the stacks file, the kind and the frame that says so, the first top frames; None: not a hang."""
    hung = (end or {}).get("hung")
    if not isinstance(hung, Mapping):
        return None
    stacks = hung.get("stacks") if isinstance(hung.get("stacks"), Mapping) else None
    found = classify(stacks)
    return {"at": hung.get("at"), "reason": hung.get("reason"), "progress": hung.get("progress"),
            "stacks": (stacks or {}).get("file"), "method": (stacks or {}).get("method"),
            "kind": found[0].kind if found else None, "waits_in": found[1] if found else None,
            "top": top_lines(stacks)[:TOP_SHOWN]}


def hung_text(summary: Mapping[str, Any]) -> str:
    """One line for people: `hung: <progress seen>; <kind> in <frame>; stacks in <file>`."""
    parts = [f"hung: {summary.get('reason')}"]
    if summary.get("kind"):
        parts.append(f"{summary['kind']} wait: {clip(str(summary.get('waits_in')), 160)}")
    if summary.get("stacks"):
        parts.append(f"stacks ({summary.get('method')}) in the run dir: {summary['stacks']}")
    return "; ".join(parts)
