"""The diagnosis of an engine the supervisor ended as hung (supervisor/hang.py): the progress it saw,
the stacks it took (supervisor/stacks.py) and what they say it waited on (diagnose/hangkinds.py, the
engine-neutral hang signatures of engines/common/hangs.yaml)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deployer.diagnose.diagnosis import Diagnosis
from deployer.diagnose.hangkinds import TOP_SHOWN, classify, top_lines
from deployer.logtext import clip

__all__ = ["hung_diagnosis"]


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
