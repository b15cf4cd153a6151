"""Smoke: `up` (with healing), one real OpenAI-compatible request through the SSH tunnel, then `down`.

Six phases, timed from the pipeline's own events, each passed / failed / skipped:

    preflight  profile, connection, lock, preflight checks      (ends at the first `attempt` event)
    push       port check, upload of the run dir                (ends at `pushed`, else the engine's first line)
    start      supervisor start, engine loading                 (ends when the engine's HTTP server is up)
    ready      warm-up until the health endpoint answers 200    (ends at `ready`)
    request    a one-token completion (the readiness probe), GET /v1/models, POST /v1/chat/completions
                                                                (a token; a non-empty answer, latency)
    stop       graceful stop under the deployment lock          (skipped with --keep)

A failure is charged to the phase that was running when it happened; the exception it raised is kept on the
report (`SmokeReport.error`) so the CLI can exit with its code. `run` itself never raises a DeployError.
"""

from __future__ import annotations

import json
import posixpath
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from deployer.errors import DeployError, LaunchFailed, ProfileError, Unhealthy
from deployer.box.lock import DeploymentLock
from deployer.runner.up import UpOptions, UpReport, up
from deployer.profile.model import Profile
from deployer.box.push import layout_for
from deployer.remote.base import Remote
from deployer.remote.json_api import JsonCall, json_object
from deployer.remote.connect import conversing, target_spec
from deployer.box.process import forget_boot, stop
from deployer.box.records import current_view, tail_lines
from deployer.box.tokenprobe import TokenProbe
from deployer.events import BecameReady, EngineExited, EngineHung, Event, EventSink, PhaseEntered, Progressed
from deployer.events import AttemptStarted, RunPushed, SmokePhase, StartupTimedOut

PHASES = ("preflight", "push", "start", "ready", "request", "stop")
LOADED_PHASES = ("http up", "ready")   # engine log phases that mean "loaded, warming up"
ENDINGS = (EngineExited, EngineHung, StartupTimedOut)            # the engine failed while starting
ENGINE_EVENTS = (PhaseEntered, Progressed, *ENDINGS)
TAIL_LINES = 40
LINE_MAX = 400
ANSWER_MAX = 200


@dataclass(frozen=True)
class SmokeOptions:
    trust_new_host: bool = False
    skip_preflight: bool = False
    heal: bool = True
    force: bool = False
    keep: bool = False
    prompt: str = "Say hello in five words."
    max_tokens: int = 8
    request_timeout_s: float = 60.0
    settle_s: float = 0.0
    local_history: bool = True  # the deploy's attempts in deployer's local history (the CLI; the API need not)


@dataclass(frozen=True)
class SmokeCase:
    """One check of a smoke as CI sees it (one JUnit testcase): a phase on one host, or a phase of one fleet
    member. `details` is the one line; `text` a failure's long form."""

    name: str
    classname: str
    status: str                               # passed | failed | skipped
    duration_s: float
    details: str
    text: str = ""


class Smoked(Protocol):
    """What every smoke report is (single host, node group, fleet): named, its cases, its error and exit code,
    the properties its JUnit suite carries and its JSON. deployer.output.junit.smoke_suite writes any of them."""

    name: str
    error: DeployError | None

    @property
    def ok(self) -> bool: ...

    @property
    def exit_code(self) -> int: ...

    def smoke_cases(self) -> list[SmokeCase]: ...

    def properties(self) -> dict[str, str]: ...

    def to_json(self) -> dict[str, Any]: ...


@dataclass
class PhaseResult:
    name: str
    status: str = "skipped"                   # passed | failed | skipped
    duration_s: float = 0.0
    details: str = ""                         # one line: what happened (or why skipped)
    text: str = ""                            # a failure's long form: diagnosis, evidence, log tail

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "duration_s": round(self.duration_s, 3),
                "details": self.details, **({"text": self.text} if self.text else {})}


@dataclass
class Answer:
    model: str
    text: str
    field: str                                # content | reasoning_content
    latency_ms: float
    models_ms: float


@dataclass
class SmokeReport:
    name: str
    host: str
    phases: dict[str, PhaseResult] = field(default_factory=lambda: {p: PhaseResult(p) for p in PHASES})
    answer: Answer | None = None
    up: dict[str, Any] | None = None
    error: DeployError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def exit_code(self) -> int:
        return 0 if self.error is None else self.error.exit_code

    def to_json(self) -> dict[str, Any]:
        a = self.answer
        return {"name": self.name, "host": self.host, "ok": self.ok, "exit_code": self.exit_code,
                "error": None if self.error is None else str(self.error),
                "phases": [p.to_json() for p in self.phases.values()],
                "latency_ms": None if a is None else round(a.latency_ms, 1),
                "model": None if a is None else a.model,
                "answer": None if a is None else a.text[:ANSWER_MAX], "up": self.up}

    def lines(self) -> list[str]:
        """The verdict, a line per phase with its time and details, and the answer the model gave."""
        verdict = "ok" if self.ok else f"FAILED (exit {self.exit_code})"
        lines = [f"smoke {self.name} on {self.host}: {verdict}"]
        for p in self.phases.values():
            took = f"{p.duration_s:6.2f}s" if p.status != "skipped" else " " * 7
            lines.append(f"  {p.name:<9} {p.status:<7} {took}  {p.details}")
        if self.answer is not None:
            a = self.answer
            lines.append(f"  answer ({a.model}, {a.latency_ms:.0f} ms): {a.text[:120]!r}")
        return lines

    def smoke_cases(self) -> list[SmokeCase]:
        classname = f"smoke.{self.name or 'profile'}"
        return [SmokeCase(p.name, classname, p.status, p.duration_s, p.details, p.text or p.details)
                for p in self.phases.values()]

    def properties(self) -> dict[str, str]:
        props = {"host": self.host, "exit_code": str(self.exit_code)}
        if self.answer is not None:
            props.update(model=self.answer.model, latency_ms=f"{self.answer.latency_ms:.1f}",
                         answer=self.answer.text[:200])
        return props


@dataclass(frozen=True)
class Stand:
    """What a smoke deploys, asks and stops. One host: the profile itself (`serving` None), the pipeline's `up`,
    the current run's graceful stop. A node group: node 0's profile serves the request, the group's `up` and
    `down` (deployer.deployments.nodes.deployment)."""

    serving: Profile | None = None
    up: Callable[[Profile, UpOptions, EventSink], UpReport] = up
    stop: Callable[[SmokeOptions], dict[str, Any]] | None = None


class PhaseClock:
    """An event sink in front of the real one: follows the pipeline's events and times each phase."""

    def __init__(self, report: SmokeReport, downstream: EventSink) -> None:
        self.report, self.downstream = report, downstream
        self.current: str | None = "preflight"
        self.since = time.monotonic()
        self.failed_in: str | None = None     # where the last attempt's engine failure happened
        self.merged_start = False

    def __call__(self, event: Event) -> None:
        self.downstream(event)
        if isinstance(event, AttemptStarted):
            self.enter("push")
        elif isinstance(event, RunPushed) and self.current == "push":
            self.enter("start")
        elif isinstance(event, ENGINE_EVENTS) and self.current == "push":
            self.merged_start = True           # no `pushed` event: push absorbed the supervisor start
            self.enter("start")
        if isinstance(event, PhaseEntered) and event.phase in LOADED_PHASES and self.current == "start":
            self.enter("ready")
        if isinstance(event, ENDINGS):
            self.failed_in = self.current
        elif isinstance(event, BecameReady):
            if self.current == "start":
                self.enter("ready")            # no "http up" line seen: warm-up took no time we could see
            self.enter(None)

    def enter(self, phase: str | None) -> None:
        now = time.monotonic()
        if self.current is not None:
            done = self.report.phases[self.current]
            done.duration_s += now - self.since
            done.status = "passed"
            self.downstream(SmokePhase(phase=done.name, status="passed", duration_s=round(done.duration_s, 3)))
        self.current, self.since = phase, now

    def fail(self, phase: str, details: str, text: str = "") -> None:
        result = self.report.phases[phase]
        if self.current == phase:
            result.duration_s += time.monotonic() - self.since
        self.current = None
        result.status, result.details, result.text = "failed", details, text
        self.downstream(SmokePhase(phase=phase, status="failed", duration_s=round(result.duration_s, 3),
                                   details=details))


def run(profile: Profile | None, opts: SmokeOptions, emit: EventSink, *,
        load_error: ProfileError | None = None, label: str = "", stand: Stand = Stand()) -> SmokeReport:
    """The whole smoke; the report says what passed, what failed and why (never raises a DeployError)."""
    report = SmokeReport(name=profile.name if profile else label, host=_host(stand.serving or profile))
    clock = PhaseClock(report, emit)
    if profile is None:
        error = load_error or ProfileError("no profile")
        report.error = error
        clock.fail("preflight", f"bad profile: {error}")
        _skip_rest(report, "not reached: the profile did not load")
        return report
    if opts.skip_preflight:
        report.phases["preflight"].details = "preflight checks skipped (--skip-preflight)"
    serving = stand.serving or profile
    started_here = _deploy(profile, opts, clock, report, stand)
    if report.error is None:
        _request_phase(serving, opts, clock, report)
    _stop_phase(serving, opts, clock, report, started_here,
                stand.stop or (lambda o: stop_current(serving, o)))
    return report


def _host(profile: Profile | None) -> str:
    if profile is None:
        return ""
    t = profile.target
    return f"{t.user + '@' if t.user else ''}{t.host}{':' + str(t.port) if t.port else ''}"


def _skip_rest(report: SmokeReport, why: str) -> None:
    for result in report.phases.values():
        if result.status == "skipped" and not result.details:
            result.details = why


def _deploy(profile: Profile, opts: SmokeOptions, clock: PhaseClock, report: SmokeReport, stand: Stand) -> bool:
    """`up`; True when this smoke started the engine that is now running (so it is ours to stop)."""
    up_opts = UpOptions(trust_new_host=opts.trust_new_host, heal=opts.heal, skip_preflight=opts.skip_preflight,
                        force=opts.force, what="smoke", local_history=opts.local_history)
    try:
        result = stand.up(profile, up_opts, clock)
    except LaunchFailed as exc:
        report.error = exc
        report.up = exc.outcome.to_json() if hasattr(exc.outcome, "to_json") else None
        _launch_failed(stand.serving or profile, opts, clock, report, exc)
        return False
    except DeployError as exc:
        report.error = exc
        phase = clock.current or "preflight"
        clock.fail(phase, f"{type(exc).__name__}: {exc}")
        _skip_rest(report, f"not reached: {phase} failed")
        return phase in ("start", "ready")
    report.up = result.to_json()
    if result.status == "already-running":
        clock.enter(None)
        why = "the same version was already running and healthy (use --force to redeploy)"
        for name in ("push", "start", "ready"):
            report.phases[name].details = why
        return False
    _note_healing(report, result.to_json().get("attempts") or [], clock.merged_start)
    return True


def _note_healing(report: SmokeReport, attempts: list[dict[str, Any]], merged_start: bool) -> None:
    report.phases["push"].details = "run dir uploaded" + (" and supervisor started" if merged_start else "")
    report.phases["start"].details = "engine loaded, HTTP server up"
    ready = report.phases["ready"]
    ready.details = f"ready on attempt {len(attempts)}" if attempts else "ready"
    healed = [_attempt_line(a) for a in attempts[:-1]]
    if healed:
        ready.details += "; healed: " + " | ".join(healed)


def _attempt_line(item: dict[str, Any]) -> str:
    diag = item.get("diagnosis") or {}
    line = f"attempt {item.get('attempt')}: {item.get('detail')}"
    if diag:
        line += f": {diag.get('signature') or 'unknown'}: {diag.get('summary')}"
    change = item.get("change") or {}
    if change:
        line += f"; changed {change.get('reason') or json.dumps({k: change.get(k) for k in ('args', 'env')})}"
    return line


def _launch_failed(profile: Profile, opts: SmokeOptions, clock: PhaseClock, report: SmokeReport,
                   exc: LaunchFailed) -> None:
    attempts = list((report.up or {}).get("attempts") or [])
    phase = clock.failed_in or clock.current or "start"
    last = attempts[-1] if attempts else {}
    tail = _engine_tail(profile, opts, str(last.get("run_id") or ""))
    clock.fail(phase, f"{exc}", _failure_text(attempts, tail))
    _skip_rest(report, f"not reached: the engine did not become ready ({phase} failed)")


def _failure_text(attempts: list[dict[str, Any]], tail: list[str]) -> str:
    lines: list[str] = []
    for item in attempts:
        lines.append(_attempt_line(item))
        diag = item.get("diagnosis") or {}
        if diag.get("hint"):
            lines.append(f"  hint: {diag['hint']}")
        lines.extend(f"  evidence: {e}" for e in diag.get("evidence") or [])
    final = (attempts[-1].get("diagnosis") or {}) if attempts else {}
    if final.get("traceback"):
        lines += ["", "first traceback of the last attempt:", str(final["traceback"])]
    if tail:
        lines += ["", f"engine.log tail (last {len(tail)} lines):", *tail]
    return "\n".join(lines)


def _engine_tail(profile: Profile, opts: SmokeOptions, run_id: str) -> list[str]:
    """The last lines of the failed attempt's engine.log (best effort: [] when the target cannot say)."""
    if not run_id:
        return []

    try:
        with _session(profile, opts) as remote:
            log = posixpath.join(layout_for(remote, profile).root, "runs", run_id, "engine.log")
            lines = tail_lines(remote, log, TAIL_LINES, window=32 << 10)
    except DeployError:
        return []
    return [x[:LINE_MAX] for x in lines]


class _session:
    """A connection to the profile's target for the phases after `up` (which closes its own)."""

    def __init__(self, profile: Profile, opts: SmokeOptions) -> None:
        self.profile, self.opts = profile, opts
        self._talk = conversing(target_spec(self.profile, self.opts.trust_new_host))

    def __enter__(self) -> Remote:
        return self._talk.__enter__()   # the helper conversation: its requests, never a bare connection

    def __exit__(self, *exc: Any) -> None:
        self._talk.__exit__(*exc)


def _request_phase(profile: Profile, opts: SmokeOptions, clock: PhaseClock, report: SmokeReport) -> None:
    clock.current, clock.since = "request", time.monotonic()
    try:
        if opts.settle_s > 0:
            time.sleep(opts.settle_s)
        with _session(profile, opts) as remote:
            key = profile.engine.args.get("api_key")
            answer = ask(remote, Endpoint(profile.engine.port, profile.engine.probe_address,
                                          str(key) if key else None), opts, TokenProbe.of(profile))
    except DeployError as exc:
        report.error = exc
        run_id = posixpath.basename(str((report.up or {}).get("run_dir") or ""))
        tail = _engine_tail(profile, opts, run_id)
        text = "\n".join([f"{type(exc).__name__}: {exc}", "", f"engine.log tail (last {len(tail)} lines):", *tail])
        clock.fail("request", str(exc), text if tail else f"{type(exc).__name__}: {exc}")
        return
    report.answer = answer
    clock.enter(None)
    report.phases["request"].details = (f"{answer.model}: {answer.latency_ms:.0f} ms, {answer.field} "
                                        f"{answer.text[:80]!r}")


@dataclass(frozen=True)
class Endpoint:
    """Where the smoke's request goes, as the target reaches it: address:port, with the API key if one is set."""

    port: int
    address: str = "127.0.0.1"
    api_key: str | None = None

    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def ask(remote: Remote, endpoint: Endpoint, opts: SmokeOptions, probe: TokenProbe | None = None) -> Answer:
    """The one-token probe `deploy up` is ready by (when given), GET /v1/models, then one chat completion
    (opts.prompt, opts.max_tokens, each answer within opts.request_timeout_s); Unhealthy unless a token comes back
    and both answer 200 with a non-empty answer."""
    port = endpoint.port
    if probe is not None:
        why = probe.ask(remote)
        if why is not None:
            raise Unhealthy(f"no token from a one-token completion on port {port}: {why}")
    t0 = time.monotonic()
    models = _json_reply(remote, endpoint, "GET", "/v1/models", None, opts.request_timeout_s)
    models_ms = (time.monotonic() - t0) * 1000
    ids = [str(m.get("id")) for m in models.get("data") or [] if isinstance(m, dict) and m.get("id")]
    if not ids:
        raise Unhealthy(f"/v1/models on port {port} lists no model: {json.dumps(models)[:200]}")
    body = {"model": ids[0], "messages": [{"role": "user", "content": opts.prompt}], "max_tokens": opts.max_tokens,
            "temperature": 0, "stream": False}
    t1 = time.monotonic()
    reply = _json_reply(remote, endpoint, "POST", "/v1/chat/completions", body, opts.request_timeout_s)
    latency_ms = (time.monotonic() - t1) * 1000
    choices = reply.get("choices")
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    raw = first.get("message")
    message: dict[str, Any] = raw if isinstance(raw, dict) else {}
    for key in ("content", "reasoning_content"):   # a reasoning model may spend 8 tokens on thinking
        text = message.get(key)
        if isinstance(text, str) and text.strip():
            return Answer(ids[0], text.strip(), key, latency_ms, models_ms)
    raise Unhealthy(f"empty answer from /v1/chat/completions on port {port} after {latency_ms:.0f} ms: "
                    f"{json.dumps(reply)[:200]}")


def _json_reply(remote: Remote, endpoint: Endpoint, method: str, path: str, body: dict[str, Any] | None,
                timeout: float) -> dict[str, Any]:
    return json_object(remote, JsonCall(endpoint.port, endpoint.address, endpoint.headers(), timeout), method, path,
                       body)


def _stop_phase(profile: Profile, opts: SmokeOptions, clock: PhaseClock, report: SmokeReport,
                started_here: bool, stop_it: Callable[[SmokeOptions], dict[str, Any]]) -> None:
    result = report.phases["stop"]
    if opts.keep:
        result.details = "left running (--keep)"
        return
    if not started_here:
        result.details = result.details or "nothing this smoke started is running"
        return
    clock.current, clock.since = "stop", time.monotonic()
    try:
        final = stop_it(opts)
    except DeployError as exc:
        report.error = report.error or exc
        clock.fail("stop", f"{type(exc).__name__}: {exc}")
        return
    clock.enter(None)
    result.details = f"stopped gracefully (status {final.get('status')})" if final.get("was_running") else \
        "was not running"


def stop_current(profile: Profile, opts: SmokeOptions) -> dict[str, Any]:
    """Graceful stop of the deployment's current run under its lock (like `deploy down`: one exec channel)."""
    with conversing(target_spec(profile, opts.trust_new_host)) as remote:
        layout = layout_for(remote, profile)
        view = current_view(remote, layout)
        if view is None:
            return {"was_running": False}
        with DeploymentLock(remote, layout, "smoke stop") as lock:
            final = stop(lock.guarded(), view.run, profile.restart.grace_s)
            forget_boot(lock.guarded(), view.run)  # a smoke's deployment does not come back after a reboot
            return final
