"""The router in front of the replicas: the model gateway `smg` (PyPI) as a deployment of its own.

Its run dir is rendered like an engine's (launch.sh from the template router_launch.sh.j2 next to this module,
that exec's `python -m smg launch ...`, a 0600 env file, profile.json, supervise.json) and runs under the same
supervisor, so `status`, `logs`, `down` read it like any deployment. What smg offers (smg 1.13.0, checked against
the real binary): `GET /readiness` ({"status", "healthy_workers", "total_workers"}, 503 without a healthy worker),
`GET /workers` (each with id, url, is_healthy, status), `POST /workers {"url"}` and `DELETE /workers/{id}` (202,
done in the background; a removed worker is `draining` until its requests finish, then gone).

The worker set is not part of the router's identity: a running router whose settings (python, port, policy, args)
are unchanged is brought to the fleet's ready replicas through the worker API instead of being restarted.
"""

from __future__ import annotations

import json
import shlex
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from deployer.errors import DeployError, LaunchFailed, NotFound, Unhealthy
from deployer.deployments.fleet.members import ROUTER_HEALTH_PATH, RouterMember
from deployer.remote.connect import spec_of
from deployer.deployments.fleet.record import try_write_record
from deployer.deployments.fleet.router_pending import pending_id, worker_answers
from deployer.deployments.fleet.router_key import (CONTROL_KEY_VAR, SHIM, control_entry, key_of, secret_args,
                                                   with_new_key)
from deployer.deployments.fleet.router_replace import fall_back, replace_router
from deployer.host import probe_address
from deployer.profile.model import Profile
from deployer.box.push import Layout, RunDir, new_run_id, push
from deployer.render.bundle import Bundle, Word, flag_tokens, render_launch
from deployer.remote.base import EndpointUnreachable, Remote
from deployer.secrets import MASK, secret_var
from deployer.box.process import status, stop
from deployer.box.switch import switch_to
from deployer.box.records import RunView, current_view
from deployer.box.session import DeploymentPlace, locked_session
from deployer.box.supervised import RecordFields, SupervisedSpec, process_record, supervise_config
from deployer.supervisor.protocol import ProfileRecord, ReplicaWatchConfig, SuperviseConfig
from deployer.supervisor.protocol import REPLICAS_FILE
from deployer.box.tokenprobe import load_gauges, progress_names
from deployer.events import BecameReady, EventSink, Info, PhaseEntered, Warn
from deployer.runner.timing import PORT_WAIT_S, stop_grace

# smg 1.13.0 model_gateway/src/server.rs:1555 ("Starting router on 127.0.0.1:8000 | mode: ...").
READY_LINE = "Starting router on"
# smg flags that take credentials: their values go to the env file, never into launch.sh.
SECRET_FLAGS = frozenset({"api_key", "control_plane_api_keys", "jwt_secret"})
CONTROL_PLANE_VAR = secret_var("router_control_plane_api_keys")
LAUNCH_TEMPLATE = Path(__file__).with_name("router_launch.sh.j2")
READY_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 120.0
POLL_S = 0.25
# smg 1.13.0's 409 while an earlier POST of the same URL waits for the worker's health check (its binary's text)
CREATING = "Worker creation already in progress"
CREATING_WAIT_S = READY_TIMEOUT_S
CREATING_EVERY_S = 1.0
CREATING_TRIES = int(CREATING_WAIT_S / CREATING_EVERY_S) + 1


@dataclass
class RouterReport:
    name: str
    host: str
    status: str                                   # ready | failed | absent
    url: str | None = None
    run_dir: str | None = None
    workers: list[str] = field(default_factory=list)   # the replica URLs it routes to, healthy
    action: str = ""                              # started | replaced | reconciled | unchanged
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def metrics_port(member: RouterMember) -> int:
    """smg's Prometheus port: router.args.prometheus_port, else the router's port + 1 (smg's own default, 29000
    on every interface, would make two routers on one host collide: the second dies at start)."""
    given = member.router.args.get("prometheus_port")
    if isinstance(given, int) and not isinstance(given, bool):
        return given
    return member.router.port + 1 if member.router.port < 65535 else member.router.port - 1


def router_words(member: RouterMember, urls: list[str], fleet: Profile) -> tuple[list[Word], dict[str, str]]:
    """smg's launch (`python -c SHIM launch`, router_key.py) with host, port, policy, the worker URLs and the
    profile's extra flags; its metrics on the router's address and port + 1 unless the profile says otherwise.
    Credentials (the replicas' key, the control key, the profile's secret flags) go to the env file, from where SHIM
    hands them to smg: none is an argv word."""
    router = member.router
    words: list[Word] = [router.python, "-c", SHIM, "launch"]
    words += flag_tokens("host", member.bind) + flag_tokens("port", router.port)
    words += flag_tokens("policy", router.policy)
    if "prometheus_port" not in router.args:
        words += flag_tokens("prometheus_port", metrics_port(member))
    if "prometheus_host" not in router.args:
        words += flag_tokens("prometheus_host", member.bind)
    if urls:
        words += ["--worker-urls", *urls]
    secret: dict[str, Any] = {}
    if member.api_key is not None and "api_key" not in router.args:  # the replicas' key, for smg to send them
        secret["api_key"] = member.api_key
    for name, value in router.args.items():
        if name == "host":
            continue  # the bind address, above
        if _secret(fleet, name) and value is not None and not isinstance(value, bool):
            secret[name] = value
        else:
            words += flag_tokens(name, value)
    if member.control_key:
        given = secret.get("control_plane_api_keys")
        given = given if isinstance(given, list) else [] if given is None else [given]
        secret["control_plane_api_keys"] = [*given, control_entry(member.control_key)]
    env = _secret_env(secret)
    if member.control_key:
        env[CONTROL_KEY_VAR] = member.control_key  # read back by the next `up` and by `status` (router_key.py)
    return words, env


def _secret_env(secret: dict[str, Any]) -> dict[str, str]:
    """The env file of the router: each secret flag's value in its variable, and SHIM's list of them."""
    env: dict[str, str] = {}
    flags: list[tuple[str, str, bool]] = []
    for name, value in secret.items():
        var = CONTROL_PLANE_VAR if name == "control_plane_api_keys" else secret_var(f"router_{name}")
        many = isinstance(value, list)
        env[var] = json.dumps([str(v) for v in value]) if many else \
            json.dumps(value) if isinstance(value, dict) else str(value)
        flags.append(("--" + name.replace("_", "-"), var, many))
    return {**env, **secret_args(flags)}


def _secret(fleet: Profile, name: str) -> bool:
    path = f"router.args.{name}"
    return name in SECRET_FLAGS or any(p == path or p.startswith(path + ".") for p in fleet.templates)


def render_router(member: RouterMember, urls: list[str], fleet: Profile) -> Bundle:
    """The router's run dir files: launch.sh from router_launch.sh.j2 (next to this module), its env file."""
    words, env = router_words(member, urls, fleet)
    return render_launch(LAUNCH_TEMPLATE, member.name, words, env)


def settings_hash(member: RouterMember, fleet: Profile) -> str:
    """What makes a router a different version: everything but its worker URLs (those change through the API)."""
    return render_router(member, [], fleet).content_hash


def router_spec(member: RouterMember, fleet: Profile, urls: list[str]) -> SupervisedSpec:
    """The router as a supervised process: its port and smg's metrics port, smg's ready line, the fleet's restart
    policy (its stop grace capped), and a record that names its fleet, its settings and its workers."""
    # `install` only when set (a record the previous release reads stays as it wrote it), and then without the
    # default `python` beside it (the two exclude each other when read back)
    router = member.router.model_dump(mode="json", exclude={"install"} if member.router.install is None else {"python"})
    router["args"] = {k: (MASK if _secret(fleet, k) else v) for k, v in member.router.args.items()}
    return SupervisedSpec(
        name=member.name, ports=(member.router.port, metrics_port(member)), ready_pattern=READY_LINE,
        grace_s=stop_grace(fleet.restart.grace_s), restart=fleet.restart,
        record=RecordFields(profile={"name": member.name, "engine": {"host": member.bind}, "router": router},
                            health_path=ROUTER_HEALTH_PATH, role="router", fleet=fleet.name,
                            settings_hash=settings_hash(member, fleet), workers=urls))


def router_record(member: RouterMember, fleet: Profile, bundle: Bundle, urls: list[str]) -> ProfileRecord:
    """profile.json of a router run dir (one attempt: a router that fails to start is not tried again)."""
    return process_record(router_spec(member, fleet, urls), bundle, attempt=1, up_id=uuid.uuid4().hex[:12])


def router_supervise(member: RouterMember, fleet: Profile) -> SuperviseConfig:
    """supervise.json of a router run dir: the router as a supervised process, and the watch of its replicas."""
    config = supervise_config(router_spec(member, fleet, []))
    watch = replica_watch(member, fleet)
    if watch is not None:
        config["replica_watch"] = watch
    return config


def replica_watch(member: RouterMember, fleet: Profile) -> ReplicaWatchConfig | None:
    """What the router's supervisor needs to judge each replica with the hang rule (replicas): the fleet
    engine's gauges and progress counters (one engine kind per fleet), `health.hang_s`, where smg's API is, and the
    env file variables of its control key and of the replicas' key. None when the rule has nothing to judge (the
    engine names no progress counter, its metrics are off, or `hang_s: off`)."""
    engine, health = fleet.engine, fleet.health
    running, waiting = load_gauges(engine.definition, engine.args)
    progress, labels = progress_names(engine.definition, engine.args)
    if not progress or not (running or waiting) or health.hang_s == "off":
        return None
    watch: ReplicaWatchConfig = {
        "address": probe_address(member.bind), "port": member.router.port, "control_key_env": CONTROL_KEY_VAR,
        "running_metrics": running, "waiting_metrics": waiting, "progress_metrics": progress,
        "path": engine.definition.launch.completion_path, "model": engine.served_model, "health_path": health.path}
    if labels:
        watch["engine_labels"] = labels
    if not isinstance(health.hang_s, str):
        watch["hang_s"] = float(health.hang_s)
    if member.api_key is not None:  # the replicas' key, in the router's env file (router_words)
        watch["api_key_env"] = secret_var("router_api_key")
    return watch


def write_replicas(remote: Remote, layout: Layout, urls: list[str]) -> None:
    """The replicas `up` put in the router, for its supervisor's watch (replicas.REPLICAS_FILE): it judges
    only these, never a worker someone else registered."""
    remote.put(json.dumps({"urls": sorted(urls)}).encode(), f"{layout.root}/{REPLICAS_FILE}", 0o644)


@contextmanager
def router_session(member: RouterMember, what: str, emit: EventSink, *, trust_new_host: bool = False,
                   break_lock: bool = False, remote: Remote | None = None) -> Iterator[tuple[Remote, Layout]]:
    """The router's deployment in a locked session (box/session.py); `remote` stays open."""
    place = DeploymentPlace(spec_of(member.target, trust_new_host), member.target.workdir, member.name)
    with locked_session(place, what, lambda m: emit(Warn(message=m)), break_lock=break_lock,
                        connection=remote) as held:
        yield held


def ensure_router(remote: Remote, layout: Layout, member: RouterMember, fleet: Profile, urls: list[str],
                  emit: EventSink, *, force: bool = False) -> RouterReport:
    """The router runs with these settings and routes to exactly `urls`, each healthy: started, replaced,
    or brought to that worker set through its API."""
    report = RouterReport(member.name, member.host, "failed", url=f"http://{member.bind}:{member.router.port}")
    view = current_view(remote, layout)
    # the running router's control key is kept (a new one changes its settings): else a new key (router_key.py)
    member = with_new_key(replace(member, control_key=(key_of(remote, view) if view else None) or member.control_key))
    same = view is not None and view.alive and view.record.get("settings_hash") == settings_hash(member, fleet)
    if same and not force and _answers(remote, member):
        assert view is not None
        report.run_dir, report.action = view.run.path, "reconciled"
        removed = set_workers(remote, member, urls, emit)
        run: RunDir | None = None
    else:
        bundle = render_router(member, urls, fleet)
        spec = router_spec(member, fleet, urls)
        record = process_record(spec, bundle, attempt=1, up_id=uuid.uuid4().hex[:12])
        run = push(remote, layout, bundle, record, router_supervise(member, fleet), new_run_id(bundle, 1))
        report.action = "started"
        if view is not None and view.alive:
            report.action = "replaced"
            _replaced(remote, layout, member, run, spec, view, emit)
        else:
            switch_to(remote, layout, run, spec, serving=None, port_wait_s=PORT_WAIT_S)
        report.run_dir, removed = run.path, set()
        emit(PhaseEntered(phase="router started", elapsed=0.0, line=" ".join(bundle.argv)[:300]))
    wait_workers(remote, member, healthy=set(urls), gone=set(), deadline_s=READY_TIMEOUT_S, run=run)
    if removed:  # ready once every worker it should not have (one someone else added too) has drained and left
        wait_workers(remote, member, healthy=set(urls), gone=removed, deadline_s=DRAIN_TIMEOUT_S, run=run)
    write_replicas(remote, layout, urls)
    report.status, report.workers = "ready", list(urls)
    emit(BecameReady(elapsed=0.0, phase=None, message=f"router ready with {len(urls)} workers"))
    warning = try_write_record(remote, member.target.workdir, fleet)
    if warning:
        emit(Warn(message=warning))
    return report


def _replaced(remote: Remote, layout: Layout, member: RouterMember, run: RunDir, spec: SupervisedSpec,
              serving: RunView, emit: EventSink) -> None:
    """The router `serving` replaced by `run`, which must come up and answer (its workers may still be joining);
    when it does not, the old router serves again and the failure is raised (router_replace.fall_back)."""
    try:
        replace_router(remote, layout, run, spec, serving, emit)
        _wait_answering(remote, member, run)
    except DeployError as failure:
        # the old router's own ready line (it may listen on another port than the new settings say)
        raise fall_back(remote, layout, run, serving.run, spec.grace_s, failure,
                        lambda: status(remote, serving.run).get("status") == "ready", emit) from None


def _wait_answering(remote: Remote, member: RouterMember, run: RunDir) -> None:
    end = time.monotonic() + READY_TIMEOUT_S
    while not _answers(remote, member):
        _check_alive(remote, member, run)
        if time.monotonic() > end:
            raise LaunchFailed(f"router {member.name} on {remote.label}: no answer after {READY_TIMEOUT_S:g}s")
        time.sleep(POLL_S)


def _answers(remote: Remote, member: RouterMember) -> bool:
    try:
        workers(remote, member)
        return True
    except Unhealthy:
        return False


def _request(remote: Remote, member: RouterMember, method: str, path: str, body: Any = None,
             timeout: float = 5.0) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"content-type": "application/json"} if data is not None else {}
    if member.bearer:  # the control key (router_key.py): smg's worker API answers 401 without it
        headers["authorization"] = f"Bearer {member.bearer}"
    try:
        reply = remote.request(method, member.router.port, path, body=data, headers=headers, timeout=timeout,
                               address=probe_address(member.bind))
    except EndpointUnreachable as exc:
        raise Unhealthy(f"router {member.name} on {remote.label}: {exc.message}") from None
    try:
        return reply.status, json.loads(reply.body or b"null")
    except ValueError:
        return reply.status, None


@dataclass(frozen=True)
class Worker:
    id: str
    url: str
    healthy: bool
    status: str


def workers(remote: Remote, member: RouterMember) -> dict[str, Worker]:
    """The router's workers by URL (GET /workers)."""
    code, data = _request(remote, member, "GET", "/workers")
    if code != 200 or not isinstance(data, dict) or not isinstance(data.get("workers"), list):
        raise Unhealthy(f"router {member.name}: GET /workers answered HTTP {code}")
    out = {}
    for item in data["workers"]:
        if isinstance(item, dict) and isinstance(item.get("url"), str):
            out[item["url"]] = Worker(str(item.get("id")), item["url"], item.get("is_healthy") is True,
                                      str(item.get("status") or ""))
    return out


def readiness(remote: Remote, member: RouterMember) -> dict[str, Any]:
    code, data = _request(remote, member, "GET", ROUTER_HEALTH_PATH)
    return {"http_status": code, **(data if isinstance(data, dict) else {})}


def add_worker(remote: Remote, member: RouterMember, url: str, deadline_s: float = CREATING_WAIT_S) -> None:
    """POST the worker; done when smg accepts it or already lists it. While smg answers 409 "Worker creation already
    in progress" (an earlier POST's job, e.g. from a client killed meanwhile or from the router's guard, still
    waits for the worker's health check) it is asked again every CREATING_EVERY_S until it lists the worker or
    accepts the POST: bounded by `deadline_s` and CREATING_TRIES. Once the worker answers its health, the pending
    job (which looks again only every 30 s) is deleted and the worker POSTed again (router_pending.py)."""
    spec = {"url": url, **({"api_key": member.api_key} if member.api_key else {})}
    end, deleted = time.monotonic() + deadline_s, set()
    for _ in range(CREATING_TRIES):
        code, data = _request(remote, member, "POST", "/workers", spec)
        if code in (200, 201, 202):
            return
        if code == 409 and url in workers(remote, member):
            return  # already registered (smg: "Worker already exists at URL ...")
        if code != 409 or CREATING not in str(data) or time.monotonic() + CREATING_EVERY_S > end:
            break
        stale = pending_id(data)  # a job that asked before the worker answered: its next look is up to 30 s away
        if stale is not None and stale not in deleted and worker_answers(remote, url, member.api_key):
            deleted.add(stale)
            _request(remote, member, "DELETE", f"/workers/{stale}")
            continue  # POSTed again at once: the new job's first look finds it answering (router_pending.py)
        time.sleep(CREATING_EVERY_S)
    raise Unhealthy(f"router {member.name}: adding worker {url} answered HTTP {code}: {str(data)[:200]}")


def remove_worker(remote: Remote, member: RouterMember, url: str) -> None:
    found = workers(remote, member).get(url)
    if found is None:
        return
    code, data = _request(remote, member, "DELETE", f"/workers/{found.id}")
    if code not in (200, 202, 204, 404):
        raise Unhealthy(f"router {member.name}: removing worker {url} answered HTTP {code}: {str(data)[:200]}")


def set_workers(remote: Remote, member: RouterMember, urls: list[str], emit: EventSink) -> set[str]:
    """Add the missing URLs and remove the ones not wanted (they drain first, in the router); the removed ones."""
    have = workers(remote, member)
    for url in urls:
        if url not in have:
            emit(Info(message=f"router: adding worker {url}"))
            add_worker(remote, member, url)
    removed = set()
    for url in have:
        if url not in urls:
            emit(Info(message=f"router: removing worker {url}"))
            remove_worker(remote, member, url)
            removed.add(url)
    return removed


def wait_workers(remote: Remote, member: RouterMember, *, healthy: set[str], gone: set[str], deadline_s: float,
                 run: RunDir | None = None) -> dict[str, Worker]:
    """Until every URL in `healthy` is a healthy worker and every URL in `gone` has left (drained), bounded."""
    end = time.monotonic() + deadline_s
    last: dict[str, Worker] = {}
    why = "no answer"
    while time.monotonic() < end:
        try:
            last = workers(remote, member)
            if all(u in last and last[u].healthy for u in healthy) and not gone & set(last):
                return last
            why = _missing(last, healthy, gone)
        except Unhealthy as exc:
            why = exc.message
            if run is not None:
                _check_alive(remote, member, run)
        time.sleep(POLL_S)
    raise LaunchFailed(f"router {member.name} on {remote.label}: not as wanted after {deadline_s:g}s: {why}")


def _missing(have: dict[str, Worker], healthy: set[str], gone: set[str]) -> str:
    parts = [f"{u} {'not healthy (' + have[u].status + ')' if u in have else 'not registered'}"
             for u in sorted(healthy) if u not in have or not have[u].healthy]
    parts += [f"{u} still {have[u].status or 'registered'}" for u in sorted(gone & set(have))]
    return "; ".join(parts)


def _check_alive(remote: Remote, member: RouterMember, run: RunDir) -> None:
    """A router that died while we wait for it: say so at once, with the end of its log."""
    state = status(remote, run)
    if state.get("status") in ("exited", "crashloop", "lost", "stopped", "absent"):
        tail = remote.run(f"tail -n 5 {shlex.quote(run.log)}", timeout=15, check=False).stdout.strip()
        raise LaunchFailed(f"router {member.name} on {remote.label} died ({state.get('status')}, exit code "
                           f"{state.get('exit_code')}): {tail.splitlines()[-1] if tail else 'no output'}")


def router_down(remote: Remote, layout: Layout, grace: float) -> bool:
    view = current_view(remote, layout)
    if view is None:
        raise NotFound(f"no router under {layout.root} on {remote.label}")
    final = stop(remote, view.run, grace)
    return bool(final.get("was_running"))


