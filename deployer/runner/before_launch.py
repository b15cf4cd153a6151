"""Before launch: run preflight and heal what it can already see, so a known failure costs seconds, not a load.

When the engine's own dry resolution rejects the arguments (some releases raise model-specific errors while
parsing), that error is diagnosed like a crash and the same remedy is applied before the first attempt.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any

from deployer.diagnose.diagnosis import diagnose
from deployer.remedy.effective import DryResolution
from deployer.errors import PreflightFailed
from deployer.flag_names import key_option
from deployer.local.history import home
from deployer.preflight.checks import PreflightReport, run_preflight
from deployer.profile.model import Profile
from deployer.remedy.propose import Change, propose
from deployer.remote.base import Remote
from deployer.runner.report import BeforeLaunchChange, UpOptions, UpReport
from deployer.events import Changed, Diagnosed, EventSink, Override, Problem, Suggestion, Warn


@dataclass
class BeforeLaunch:
    """Preflight for one `up`: its options, the report its notes and warnings go to, its events, the changes
    tried so far (shared with the attempts: no identical change twice)."""

    opts: UpOptions
    report: UpReport
    emit: EventSink
    tried: list[Change]

    def checked(self, remote: Remote, profile: Profile, *, own_port: bool
                ) -> tuple[Profile, str | None, DryResolution | None]:
        """The profile to launch (flags translated, pre-launch remedies applied), the target's engine version, and
        the engine's dry resolution of that profile's args (where it ran): the effective values remedies start
        from."""
        for _ in range(profile.retry.max_attempts):
            result = run_preflight(remote, profile, cache_dir=home() / "cache", model_config=self.opts.model_config,
                                   own_port=own_port)
            version = result.engine_version or profile.engine.version
            if not result.problems:
                self._tell(result)
                dry = None if result.resolved is None else \
                    DryResolution(args=dict(result.profile.engine.args), resolved=result.resolved)
                return result.profile, version, dry
            profile = self._healed(result, version)
        raise PreflightFailed([f"still rejected after {profile.retry.max_attempts} changes before launch"])

    def _healed(self, result: PreflightReport, version: str | None) -> Profile:
        """The profile with the change for what preflight found; PreflightFailed when nothing may change it."""
        refused = result.refusal()  # flags nothing may fix: never dropped, refused (exit 2)
        if refused is not None:
            self._tell(result)
            for problem in result.problems:
                self.emit(Problem(message=problem))
            raise refused
        rejection = result.rejection or _as_argparse_error(result)
        known = set(result.unknown_flags.values())
        others = [p for p in result.problems if not p.startswith("the engine rejects") and p not in known]
        if rejection is None or others:  # healing the arguments cannot fix the rest
            self._tell(result)
            for problem in result.problems:
                self.emit(Problem(message=problem))
            for suggestion in result.memory.suggestions if result.memory else []:
                self.emit(Suggestion(message=suggestion))
            raise PreflightFailed(result.problems, hint=_first_suggestion(result.memory))
        diag = diagnose(rejection, engine_version=version, engine=result.profile.engine.definition)
        self.emit(Diagnosed(attempt=0, stage="preflight", **diag.to_json(), hint=diag.hint))
        change = propose(diag, result.profile, self.tried) if self.opts.heal and diag.signature else None
        if change is None:
            raise PreflightFailed([f"the engine rejects these arguments: {diag.summary}"], hint=diag.hint)
        self.tried.append(change)
        self.report.before_launch.append(BeforeLaunchChange(diag, change))
        self.emit(Changed(attempt=0, before_launch=True, **change.to_json()))
        return result.profile.patched(args=change.args, env=change.env)

    def _tell(self, result: PreflightReport) -> None:
        """Warnings and overrides of the round that counts (not of arguments that were rejected and changed)."""
        for line in result.warnings:
            self.emit(Warn(message=line))
            self.report.warnings.append(line)
        for line in result.overrides:
            self.emit(Override(message=line))


def _as_argparse_error(result: PreflightReport) -> str | None:
    """Flags the target's engine does not have, as its argparse would reject them (usage lists its own flags):
    the same remedy then renames, respells (did-you-mean) or drops them as after a rejected launch."""
    if not result.unknown_flags:
        return None
    # Wrapped as argparse wraps it: one line of every flag would be cut by the diagnosis' per-line cap.
    prog = result.profile.engine.definition.log.cli_prog
    usage = "\n".join(textwrap.wrap(f"usage: {prog} " + " ".join(f"[{key_option(k)}]" for k in result.flag_names),
                                    width=100, subsequent_indent="    ", break_long_words=False))
    words = []
    for key in result.unknown_flags:
        value = result.profile.engine.args.get(key)
        words += [key_option(key)] + ([] if isinstance(value, (bool, list, dict)) or value is None else [str(value)])
    return f"{usage}\n{prog}: error: unrecognized arguments: {' '.join(words)}\n"


def _first_suggestion(plan: Any) -> str | None:
    return f"would fit: {plan.suggestions[0]}" if plan is not None and plan.suggestions else None
