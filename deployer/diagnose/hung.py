"""The diagnosis of an engine the supervisor ended as hung (supervisor/supervise_hang.py): the progress it saw,
the stacks it took (supervisor/supervise_stacks.py) and what they say it waited on, classified with the
engine-neutral hang signatures of engines/common/hangs.yaml (a collective wait, a lock, a blocking call, the GIL,
a stopped process)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import yaml

from deployer.diagnose.diagnosis import Diagnosis
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


def classify(stacks: Mapping[str, Any] | None) -> tuple[HangKind, str] | None:
    """The kind of hang the stacks show and the frame that says so; None when no signature matches."""
    lines = top_lines(stacks)
    for kind in hang_kinds():
        line = kind.matches(lines)
        if line is not None:
            return kind, line
    return None


def hung_diagnosis(end: Mapping[str, Any]) -> Diagnosis | None:
    """The diagnosis of a run the hang rule ended (`end`: state.json's last_crash, or the state); None when the
    hang rule did not end it."""
    hung = end.get("hung")
    if not isinstance(hung, Mapping):
        return None
    stacks = hung.get("stacks") if isinstance(hung.get("stacks"), Mapping) else None
    found = classify(stacks)
    kind = f": {found[0].kind}, {found[0].summary}" if found else ""
    evidence = [f"progress: {hung.get('reason')} (progress counter at {hung.get('progress')})"]
    if stacks is not None:
        evidence.append(f"stacks ({stacks.get('method')}) in the run dir: {stacks.get('file')}")
        if found:
            evidence.append(f"waits in: {clip(found[1], 200)}")
        evidence.extend(clip(line, 200) for line in top_lines(stacks)[:TOP_SHOWN])
    hint = found[0].hint if found else "see the stacks file in the run dir for where each thread waits"
    return Diagnosis(signature="hung", transient=True,
                     summary=f"the engine held requests and made no progress: hung{kind}",
                     evidence=evidence, hint=f"the supervisor took its stacks and restarted it (a crash for the "
                                             f"restart policy); {hint}")
