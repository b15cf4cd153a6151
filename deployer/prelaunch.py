"""Before launch: run preflight and heal what it can already see, so a known failure costs seconds, not a load.

When the engine's own dry resolution rejects the arguments (older SGLang raises its model-specific errors while
parsing), that error is diagnosed like a crash and the same remedy is applied before the first attempt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deployer.diagnose import diagnose
from deployer.errors import PreflightFailed
from deployer.profile import Profile
from deployer.remedy import Change, propose
from deployer.remote import Remote
from deployer.watch import Event, EventSink


def checked_profile(remote: Remote, profile: Profile, *, heal: bool, model_config: Path | None, own_port: bool,
                    tried: list[Change], emit: EventSink, notes: list[dict[str, Any]],
                    warnings: list[str]) -> tuple[Profile, str | None]:
    """The profile to launch (flags translated, pre-launch remedies applied) and the target's engine version."""
    from deployer.preflight import run_preflight
    from deployer.state import home

    for _ in range(profile.retry.max_attempts):
        result = run_preflight(remote, profile, cache_dir=home() / "cache", model_config=model_config,
                               own_port=own_port)
        version = result.engine_version or profile.engine.version
        if not result.problems:
            _tell(result, emit, warnings)
            return result.profile, version
        others = [p for p in result.problems if not p.startswith("the engine rejects")]
        if result.rejection is None or others:  # healing the arguments cannot fix the rest
            _tell(result, emit, warnings)
            for problem in result.problems:
                emit(Event("problem", {"message": problem}))
            for suggestion in result.memory.suggestions if result.memory else []:
                emit(Event("suggestion", {"message": suggestion}))
            raise PreflightFailed(result.problems, hint=_first_suggestion(result.memory))
        diag = diagnose(result.rejection, engine_version=version, kind=profile.engine.kind)
        note: dict[str, Any] = {"stage": "preflight", **diag.to_json(), "hint": diag.hint}
        emit(Event("diagnosis", {"attempt": 0, **note}))
        change = propose(diag, result.profile, tried) if heal and diag.signature else None
        if change is None:
            raise PreflightFailed([f"the engine rejects these arguments: {diag.summary}"], hint=diag.hint)
        tried.append(change)
        note["change"] = change.to_json()
        notes.append(note)
        emit(Event("change", {"attempt": 0, "before_launch": True, **change.to_json()}))
        profile = result.profile.patched(args=change.args, env=change.env)
    raise PreflightFailed([f"still rejected after {profile.retry.max_attempts} changes before launch"])


def _tell(result: Any, emit: EventSink, warnings: list[str]) -> None:
    """Warnings and overrides of the round that counts (not of arguments that were rejected and changed)."""
    for line in result.warnings:
        emit(Event("warning", {"message": line}))
        warnings.append(line)
    for line in result.overrides:
        emit(Event("override", {"message": line}))


def _first_suggestion(plan: Any) -> str | None:
    return f"would fit: {plan.suggestions[0]}" if plan is not None and plan.suggestions else None
