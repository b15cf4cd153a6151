"""What `up` was asked (UpOptions) and what it did (UpReport, one AttemptReport per attempt): typed values, dicts
only in `to_json()` (the JSON of `--json`, outcome.json and the local history, the same as before)."""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from deployer.diagnose.diagnosis import Diagnosis
from deployer.logtext import bounded_diagnosis
from deployer.observe.timeline import StartKey, Timeline
from deployer.profile.model import Restart
from deployer.remedy.propose import Change
from deployer.watch.watcher import Crashed, Hung, Outcome, PortTaken, ProbeRefused, Ready, Stuck, TimedOut, Unsupervised

AttemptOutcome = Literal["ready", "crashed", "hung", "timeout", "port-taken", "supervisor-lost", "probe-refused",
                         "not-started"]
UpStatus = Literal["ready", "already-running", "failed"]

OUTCOME_NAMES: dict[type, AttemptOutcome] = {
    Ready: "ready", Crashed: "crashed", Hung: "hung", Stuck: "crashed", TimedOut: "timeout",
    PortTaken: "port-taken", Unsupervised: "supervisor-lost", ProbeRefused: "probe-refused"}


@dataclass(frozen=True)
class UpOptions:
    trust_new_host: bool = False
    heal: bool = True
    skip_preflight: bool = False
    save_fixed: Path | None = None
    model_config: Path | None = None
    force: bool = False
    what: str = "up"
    rollback: bool = True     # a failed replace brings the version that was serving back
    break_lock: bool = False
    local_history: bool = True  # write the attempts to deployer's local history (the CLI does; the API need not)
    canary: bool = False      # a serving fleet: its first replaced replica judged first (deployer/deployments/fleet/canary.py)


@dataclass(frozen=True)
class FailedNode:
    """The node of a group whose failure the diagnosis is from (the first that failed)."""

    rank: int
    host: str


@dataclass(frozen=True)
class PhaseSeen:
    """A phase the engine's log showed, `elapsed` seconds after the launch."""

    phase: str
    elapsed: float

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "elapsed": self.elapsed}


@dataclass
class AttemptReport:
    attempt: int
    run_id: str
    content_hash: str
    outcome: AttemptOutcome
    detail: str
    diagnosis: Diagnosis | None = None
    change: Change | None = None              # the change made after this attempt
    drift: list[str] = field(default_factory=list)
    failed_node: FailedNode | None = None     # a node group: where the diagnosis comes from
    phases: list[PhaseSeen] = field(default_factory=list)  # what the watch saw, in order (node 0's for a group)
    timeline: Timeline | None = None          # the phases with their durations (observe/timeline.py)
    start_key: StartKey | None = None         # what later starts are compared by (runner/startup.py)

    def diagnosis_json(self) -> dict[str, Any] | None:
        """The diagnosis as outcome.json, the history and the output show it (its texts bounded)."""
        if self.diagnosis is None:
            return None
        data: dict[str, Any] = {**self.diagnosis.to_json(), "hint": self.diagnosis.hint}
        if self.failed_node is not None:
            data.update(node=self.failed_node.rank, host=self.failed_node.host)
        return bounded_diagnosis(data)

    def change_json(self) -> dict[str, Any] | None:
        return None if self.change is None else self.change.to_json()

    def to_json(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "run_id": self.run_id, "content_hash": self.content_hash,
                "outcome": self.outcome, "detail": self.detail, "diagnosis": self.diagnosis_json(),
                "change": self.change_json(), "drift": list(self.drift),
                "phases": [p.to_json() for p in self.phases],
                "timeline": None if self.timeline is None else self.timeline.to_json(),
                "start_key": None if self.start_key is None else dataclasses.asdict(self.start_key)}


@dataclass
class RestoredVersion:
    """The version brought back after a failed replace, and how that went (status: the watch's outcome)."""

    run_id: str
    content_hash: str
    run_dir: str
    status: str | None = None
    detail: str | None = None

    @property
    def serving(self) -> bool:
        return self.status == "ready"

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"run_id": self.run_id, "content_hash": self.content_hash, "run_dir": self.run_dir}
        if self.status is not None:
            data["status"] = self.status
        if self.detail is not None:
            data["detail"] = self.detail
        return data


@dataclass(frozen=True)
class BeforeLaunchChange:
    """The engine rejected the arguments at preflight: why, and the change made before the first launch."""

    diagnosis: Diagnosis
    change: Change

    def diagnosis_json(self) -> dict[str, Any]:
        return {"stage": "preflight", **self.diagnosis.to_json(), "hint": self.diagnosis.hint}

    def to_json(self) -> dict[str, Any]:
        return {**self.diagnosis_json(), "change": self.change.to_json()}


LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


@dataclass(frozen=True)
class Reach:
    """How to reach a ready server: the target as the profile names it (an ssh alias works), the address and port
    the engine binds there, the model name to ask for, whether it wants an API key."""

    host: str
    user: str | None
    ssh_port: int | None
    bind: str
    port: int
    model: str
    api_key: bool = False

    @property
    def tunnel(self) -> bool:
        """Bound to the target's loopback only: reachable from here through an SSH tunnel (or on the box)."""
        return self.bind in LOOPBACK and self.host != "local"

    @property
    def base_url(self) -> str:
        if self.tunnel or self.host == "local":
            return f"http://127.0.0.1:{self.port}"
        bind = self.bind.strip("[]")
        return f"http://{self.host if bind in ('', '0.0.0.0', '::') else self.bind}:{self.port}"

    def ssh_argv(self) -> list[str]:
        """The tunnel's ssh command as words (a destination that starts with `-` comes after `--`: a destination,
        never an option such as -oProxyCommand)."""
        port = ["-p", str(self.ssh_port)] if self.ssh_port else []
        destination = f"{self.user}@{self.host}" if self.user else self.host
        end = ["--"] if destination.startswith("-") else []
        return ["ssh", "-N", "-L", f"{self.port}:{self.bind.strip('[]')}:{self.port}", *port, *end, destination]

    def ssh_command(self) -> str:
        """The tunnel's ssh command, safe to paste into a shell whatever the profile's values (shell-quoted)."""
        return shlex.join(self.ssh_argv())

    def curl_commands(self) -> list[str]:
        """Example requests, safe to paste into a shell: every word shell-quoted from its parts (the model name
        inside a JSON body, the body one word), except the fixed `$API_KEY` header, which the shell expands."""
        auth = ' -H "Authorization: Bearer $API_KEY"' if self.api_key else ""
        body = json.dumps({"model": self.model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 32},
                          ensure_ascii=False)
        chat = [f"{self.base_url}/v1/chat/completions", "-H", "content-type: application/json", "-d", body]
        return [f"curl{auth} {shlex.quote(self.base_url + '/v1/models')}", f"curl{auth} {shlex.join(chat)}"]

    def lines(self) -> list[str]:
        """What to type to talk to the server: the tunnel (when it binds loopback), then example requests."""
        out = [f"reach it through an SSH tunnel (it listens on {self.bind} of the box): {self.ssh_command()} &"] \
            if self.tunnel else [f"reach it at {self.base_url}/v1 (OpenAI API)"]
        return out + ["  " + command for command in self.curl_commands()]

    def to_json(self) -> dict[str, Any]:
        return {"url": f"{self.base_url}/v1", "bind": self.bind, "port": self.port, "model": self.model,
                "ssh_tunnel": self.ssh_command() if self.tunnel else None}


@dataclass
class UpReport:
    name: str
    host: str
    status: UpStatus
    run_dir: str | None = None
    content_hash: str | None = None
    attempts: list[AttemptReport] = field(default_factory=list)
    replaced: str | None = None
    warnings: list[str] = field(default_factory=list)
    drift: list[str] = field(default_factory=list)
    saved_fixed: str | None = None
    before_launch: list[BeforeLaunchChange] = field(default_factory=list)   # preflight's diagnoses and changes
    restored: RestoredVersion | None = None   # the version brought back after a failed replace
    reach: Reach | None = None                # how to talk to the server (a single host's up)
    restart: dict[str, Any] | None = None     # what the target does with a crash after ready (restart_summary)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "host": self.host, "status": self.status, "run_dir": self.run_dir,
                "restart": self.restart,
                "content_hash": self.content_hash, "attempts": [a.to_json() for a in self.attempts],
                "replaced": self.replaced, "warnings": list(self.warnings), "drift": list(self.drift),
                "saved_fixed": self.saved_fixed, "before_launch": [n.to_json() for n in self.before_launch],
                "restored": None if self.restored is None else self.restored.to_json(),
                "reach": None if self.reach is None or self.status == "failed" else self.reach.to_json()}


def restart_summary(restart: Restart) -> dict[str, Any]:
    """What the target's supervisor does with a crash after ready, as data and as the line `up` prints."""
    first, cap = restart.backoff_s
    if restart.policy == "no":
        text = "a crash after ready stays down (restart.policy: no)"
    else:
        text = (f"a crash after ready is restarted on the target (restart.policy: {restart.policy}, backoff "
                f"{first:g}-{cap:g} s, crashloop after {restart.max} restarts in {restart.window_s:g} s; "
                "restart.policy: no turns it off)")
    if restart.on_boot:
        text += "; started again when the box reboots (restart.on_boot)"
    return {"policy": restart.policy, "max": restart.max, "backoff_s": [first, cap], "window_s": restart.window_s,
            "stable_s": restart.stable_s, "on_boot": restart.on_boot, "text": text}


def outcome_name(outcome: Outcome) -> AttemptOutcome:
    return OUTCOME_NAMES[type(outcome)]


def describe(outcome: Outcome) -> str:
    return "ready" if isinstance(outcome, Ready) else outcome.describe()
