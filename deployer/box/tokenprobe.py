"""The one-token probe as deployer sends it: before `ready` (watch), in `deploy smoke`, and as the supervisor's
configuration after ready (supervise.json's "probe").

The request and the judgement of its answer are the supervisor's (supervisor/probe.py), so the
target-side probe and this one cannot drift apart; the endpoint is the engine's (Launch.completion_path), the
model the name the engine serves (Engine.served_model), the load gauges the engine's metrics.yaml names.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deployer.engines.base import Engine
from deployer.observe.names import MetricNames, MetricNamesUnreadable, Quantity, load_metric_names
from deployer.remote.base import EndpointUnreachable, Remote
from deployer.secrets import secret_var
from deployer.host import probe_address
from deployer.supervisor.probe import generated, request_body
from deployer.supervisor.protocol import ProbeConfig

if TYPE_CHECKING:
    from deployer.profile.model import Profile


@dataclass(frozen=True)
class TokenProbe:
    """One-token completions to one engine, as the target reaches it."""

    port: int
    model: str
    path: str = "/v1/completions"
    address: str = "127.0.0.1"
    api_key: str | None = None
    timeout_s: float = 30.0

    @classmethod
    def of(cls, profile: Profile, port: int | None = None) -> TokenProbe:
        engine = profile.engine
        key = engine.args.get("api_key")
        return cls(port or engine.port, engine.served_model, engine.definition.launch.completion_path,
                   engine.probe_address, str(key) if key else None, profile.health.probe_timeout_s)

    @classmethod
    def of_record(cls, record: Mapping[str, Any], profile: Profile) -> TokenProbe:
        """The probe of an earlier run (its profile.json: its port, address and served model), with the API key
        of `profile` (the record masks it)."""
        now = cls.of(profile)
        engine = (record.get("profile") or {}).get("engine") or {}
        args = engine.get("args") or {}
        model = args.get("served_model_name") or engine.get("model_path") or now.model
        if isinstance(model, list):
            model = model[0] if model else now.model
        bind = engine.get("host")
        return dataclasses.replace(now, port=int(record.get("port") or now.port), model=str(model),
                                   address=probe_address(bind) if isinstance(bind, str) else "127.0.0.1")

    def ask(self, remote: Remote) -> str | None:
        """None when the engine generated a token; else why not, in one line."""
        return self.answer(remote).why

    def answer(self, remote: Remote) -> ProbeAnswer:
        """One probe: the HTTP status (None: no answer) and why no token came (None: one came)."""
        started = time.monotonic()
        try:
            reply = remote.request("POST", self.port, self.path, body=request_body(self.model),
                                   headers={"content-type": "application/json", **self._auth()},
                                   timeout=self.timeout_s, address=self.address)
        except EndpointUnreachable as exc:
            return ProbeAnswer(None, f"no answer to a one-token completion after {time.monotonic() - started:.1f} s: "
                                     f"{exc}")
        return ProbeAnswer(reply.status, generated(reply.status, reply.body))

    def served_models(self, remote: Remote) -> list[str] | None:
        """The model names the engine says it serves (GET /v1/models, as OpenAI's API lists them); None when it
        does not answer that."""
        try:
            reply = remote.request("GET", self.port, "/v1/models", headers=self._auth(), timeout=self.timeout_s,
                                   address=self.address)
            data = json.loads(reply.body) if reply.status == 200 else None
        except (EndpointUnreachable, ValueError):
            return None
        models = data.get("data") if isinstance(data, dict) else None
        if not isinstance(models, list):
            return None
        return [str(m["id"]) for m in models if isinstance(m, dict) and m.get("id") is not None]

    def _auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass(frozen=True)
class ProbeAnswer:
    """What one one-token probe got: the HTTP status (None: no answer at all) and why no token (None: a token)."""

    status: int | None
    why: str | None


def _served_names(engine: Engine, args: Mapping[str, Any]) -> MetricNames | None:
    """The engine's metric names (its metrics.yaml), or None when it has none or the profile's `args` turn its
    metrics off (the supervisor then never asks /metrics)."""
    path = engine.knowledge.metrics
    if path is None:
        return None
    try:
        names = load_metric_names(path)
    except MetricNamesUnreadable:
        return None
    return None if names.switch is not None and not names.switch.serves(args) else names


def load_gauges(engine: Engine, args: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The engine's gauges of requests running and waiting (none when it names none or its metrics are off)."""
    names = _served_names(engine, args)
    if names is None:
        return [], []
    return ([m.name for m in names.candidates(Quantity.REQUESTS_RUNNING)],
            [m.name for m in names.candidates(Quantity.REQUESTS_WAITING)])


def progress_names(engine: Engine, args: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The engine's forward-progress counters (its metrics.yaml `progress`: series that advance on every engine
    step, the hang rule's) and the labels that tell its data-parallel engines apart (`engine_labels`); none when it
    names none or its metrics are off."""
    names = _served_names(engine, args)
    if names is None:
        return [], []
    return [m.name for m in names.progress], list(names.engine_labels)


def probe_config(profile: Profile) -> ProbeConfig:
    """supervise.json's "probe": the supervisor's one-token probe after ready."""
    engine, health = profile.engine, profile.health
    running, waiting = load_gauges(engine.definition, engine.args)
    config: ProbeConfig = {"path": engine.definition.launch.completion_path, "model": engine.served_model,
                           "address": engine.probe_address, "port": engine.port, "health_path": health.path,
                           "interval_s": health.probe_interval_s, "failures": health.probe_failures,
                           "timeout_s": health.probe_timeout_s, "exit_grace_s": health.probe_exit_grace_s,
                           "running_metrics": running,
                           "waiting_metrics": waiting}
    progress, engine_labels = progress_names(engine.definition, engine.args)
    if progress and health.hang_s != "off":  # added keys: only when there is something to judge (hang)
        config["progress_metrics"] = progress
        if engine_labels:
            config["engine_labels"] = engine_labels
    if not isinstance(health.hang_s, str):
        config["hang_s"] = float(health.hang_s)
    if engine.args.get("api_key"):
        from_env = engine.definition.launch.secret_env_var("api_key")  # render put it there (Launch.secret_env)
        config["api_key_env"] = from_env if from_env and isinstance(engine.args["api_key"], str) else \
            secret_var("api_key")
    return config
