"""An attempt's log window and its diagnosis: the first traceback and the tail, whatever the log's size; the
diagnosis of a crash, a hang, a timeout or a lost supervisor; the values the engine really used (remedies start
from them). Used for a single host and for each rank of a node group alike."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from deployer.diagnose.diagnosis import (Diagnosis, diagnose, group_peer_lost, hang_diagnosis, no_token_diagnosis,
                                         oom_killer_lines, peer_lost_reason)
from deployer.diagnose.hung import hung_diagnosis
from deployer.diagnose.drift import parse_args_dump
from deployer.remedy.effective import DryResolution, EngineValues, engine_values
from deployer.engines import Engine
from deployer.errors import DeployError, TargetError
from deployer.profile.model import Profile
from deployer.box.push import RunDir
from deployer.remote.base import Remote
from deployer.box.process import Launch
from deployer.box.records import read_json
from deployer.watch.watcher import Crashed, Hung, Outcome, ProbeRefused, Stuck, TimedOut, Unsupervised

DIAG_WINDOW = 1 << 20
TAIL_WINDOW = 512 << 10
HEAD_WINDOW = 512 << 10       # the log's head, where the engine prints its arguments
TRACEBACK = "Traceback (most recent call last)"


def attempt_values(remote: Remote, launch: Launch, diag: Diagnosis, profile: Profile,
                    dry: DryResolution | None) -> EngineValues:
    """What the engine used in this attempt: its own args dump (in the diagnosed window, else the log's head),
    else the dry resolution of these args, else the profile."""
    dump = diag.engine_args
    if dump is None:
        try:
            head = log_head(remote, launch)
        except (DeployError, OSError):
            head = ""   # no log to read: the dry resolution and the profile still say what was asked
        dump = parse_args_dump(head, profile.engine.definition.log.args_dump)
    return engine_values(dump, dry, dict(profile.engine.args))


def log_head(remote: Remote, launch: Launch) -> str:
    """The start of this attempt's log (where engines print the arguments they run with)."""
    return remote.read(launch.run.log, launch.log_offset, HEAD_WINDOW).decode("utf-8", "replace")


def diagnose_attempt(remote: Remote, launch: Launch, outcome: Outcome, version: str | None, *,
                     engine: Engine) -> Diagnosis:
    if isinstance(outcome, Unsupervised):  # started again under a new supervisor, once per `up`
        return Diagnosis(signature="supervisor-lost", summary=outcome.describe(), transient=True,
                         evidence=outcome.tail[-5:],
                         hint="something killed the supervisor (the OOM killer? a cleanup job?): see the target's "
                              "kernel log; the engine was stopped so that it runs only under a supervisor")
    if isinstance(outcome, ProbeRefused):  # an answer, not silence: the profile's probe does not fit this engine
        return Diagnosis(signature="probe-refused", summary=outcome.meaning(), transient=False,
                         evidence=[outcome.why], hint=_refused_hint(outcome))
    if isinstance(outcome, (Hung, TimedOut)):
        stalled = outcome.stalled_s if isinstance(outcome, Hung) else outcome.elapsed
        diag = hang_diagnosis(outcome.tail, stalled)
        if isinstance(outcome, Hung):
            return diag
        evidence = [outcome.no_token] if outcome.no_token else []
        return dataclasses.replace(diag, summary=outcome.describe(), evidence=[*evidence, *diag.evidence])
    if isinstance(outcome, Stuck):  # stopped by us after its fatal line: the log says why, as a crash's would
        return diagnose_run(remote, launch.run, Ending(launch.log_offset, _state_traceback(remote, launch.run)),
                            version, engine=engine)
    assert isinstance(outcome, Crashed)
    tb_offset = outcome.traceback_offset
    if tb_offset is None:  # the supervisor writes its final state after its last scan
        tb_offset = _state_traceback(remote, launch.run)
    return diagnose_run(remote, launch.run, Ending(launch.log_offset, tb_offset, outcome.exit_code, outcome.signal),
                        version, engine=engine)


def _refused_hint(outcome: ProbeRefused) -> str:
    if outcome.served and outcome.model not in outcome.served:
        return (f"the probe asks for the model the profile serves ({outcome.model!r}); the engine serves "
                f"{outcome.served[0]!r}: set engine.args.served_model_name (or model_path) so the two agree")
    if outcome.status in (401, 403):
        return "the engine refused the probe's API key: check engine.args.api_key and the engine's own key settings"
    return (f"the engine has no {outcome.path} for this request: check the engine kind and its version (the probe "
            "uses the engine's OpenAI-compatible completions endpoint)")


def diagnose_state(remote: Remote, run: RunDir, state: Mapping[str, Any], version: str | None, *,
                   engine: Engine) -> Diagnosis:
    """The diagnosis of a run's last engine death, from what its supervisor recorded (state.json)."""
    end = state.get("last_crash") or state
    hung = hung_diagnosis(end)  # the hang rule ended it (hang): its progress and stacks
    if hung is not None:
        return hung
    probe = no_token_diagnosis(dict(end))
    if probe is not None:
        return probe
    ending = Ending(int(end.get("log_offset") or 0), end.get("traceback_offset"), end.get("exit_code"),
                    end.get("signal"))
    diag = diagnose_run(remote, run, ending, version, engine=engine)
    lost = peer_lost_reason(end)
    if lost is not None and _names_nothing_else(diag, engine):
        return group_peer_lost(lost, engine.kind)   # a node group's rank its supervisor stopped for its group
    return diag


def _names_nothing_else(diag: Diagnosis, engine: Engine) -> bool:
    """Whether a rank's own log says nothing but what a lost peer causes (nothing, a signal: the supervisor's own
    SIGKILL of a stopped rank, or one of the engine's peer-failure signatures)."""
    multinode = engine.launch.multinode
    peers = multinode.peer_failures if multinode else frozenset()
    return diag.signature is None or diag.signature == "killed-by-signal" or diag.signature in peers


@dataclass(frozen=True)
class Ending:
    """How one engine run ended, as far as its log window goes: where its output starts, where its first
    traceback starts (noted by the supervisor), its exit code or signal."""

    offset: int
    traceback_offset: int | None = None
    exit_code: int | None = None
    signal: int | None = None


def diagnose_run(remote: Remote, run: RunDir, ending: Ending, version: str | None, *, engine: Engine) -> Diagnosis:
    """Diagnose one engine run's log window; a death by signal with no traceback gets the host's OOM-killer lines."""
    text = attempt_log(remote, run, ending.offset, ending.traceback_offset)
    diag = diagnose(text, engine_version=version, exit_code=ending.exit_code, signal=ending.signal, engine=engine)
    if diag.signature == "killed-by-signal":
        dmesg = remote.helper.kernel_log(300)
        diag = dataclasses.replace(diag, evidence=[*diag.evidence, *oom_killer_lines(dmesg)[-3:]])
    return diag


def _state_traceback(remote: Remote, run: RunDir) -> int | None:
    value = (read_json(remote, run.state) or {}).get("traceback_offset")
    return int(value) if isinstance(value, int) else None


def attempt_log(remote: Remote, run: RunDir, offset: int, traceback_offset: int | None = None) -> str:
    """A bounded window of this attempt's log: its first traceback and its tail, whatever the log's size.

    The supervisor notes where the first traceback starts while the log is written; without that note (an older
    supervisor, a log from elsewhere) the target greps for it.
    """
    size = remote.size(run.log) or 0
    if size - offset <= DIAG_WINDOW + TAIL_WINDOW:
        return remote.read(run.log, offset, DIAG_WINDOW + TAIL_WINDOW).decode("utf-8", "replace")
    start = traceback_offset if traceback_offset is not None and traceback_offset >= offset else \
        _grep_traceback(remote, run, offset)
    parts: list[bytes] = []
    if start is not None:
        parts.append(remote.read(run.log, start, DIAG_WINDOW))
    tail_from = max(offset, size - TAIL_WINDOW, start + DIAG_WINDOW if start is not None else 0)
    parts.append(remote.read(run.log, tail_from, TAIL_WINDOW))
    return b"\n".join(parts).decode("utf-8", "replace")


def _grep_traceback(remote: Remote, run: RunDir, offset: int) -> int | None:
    try:
        return remote.helper.find_bytes(run.log, TRACEBACK.encode(), offset)
    except TargetError:
        return None   # no log (or unreadable): no traceback to start the window at
