"""A supervised process on a target, as data: what the supervisor runs (supervise.json) and what the run dir
keeps about it (profile.json), each made from one `SupervisedSpec` by one function.

An engine (push.supervisor_config / profile_record, from a Profile) and the fleet's router
(deployments/fleet/router.py, from its RouterMember) are both such a process; they differ only in the fields below. The JSON keys and their order
are the ones the previous releases wrote (tests/unit/records pins them): a field left ABSENT is not written.
(The formats themselves: supervisor/protocol.py.)
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union, cast

from deployer.supervisor.base import DEFAULT_LOGS, DEFAULT_RESTART
from deployer.supervisor.protocol import (
    ENGINE_LOG, ENV_FILE, LAUNCH_SH, LogsConfig, ProbeConfig, ProfileRecord, SuperviseConfig,
)

if TYPE_CHECKING:
    from deployer.profile.model import Logs, Restart
    from deployer.render.bundle import Bundle


class _Absent(enum.Enum):
    ABSENT = "absent"


ABSENT = _Absent.ABSENT
"""A record field this kind of process does not write (distinct from None, which is written as null)."""


@dataclass(frozen=True)
class FatalWatch:
    """Log lines that end a start at once (an engine's bind error), and how long the process may outlive one."""

    patterns: Sequence[str]
    grace_s: float


@dataclass(frozen=True)
class RecordFields:
    """What profile.json holds beyond the launch bundle, in the order written; ABSENT fields are left out."""

    profile: dict[str, Any]                           # what the deployment was made from (secrets masked)
    health_path: str
    role: str | _Absent = ABSENT                      # "router"
    fleet: str | _Absent = ABSENT                     # the fleet a router stands in front of
    settings_hash: str | _Absent = ABSENT             # a router's identity without its worker set
    written_hash: Union[str, None, _Absent] = ABSENT  # an engine's profile as the user wrote it (None: unknown)
    kind: str | _Absent = ABSENT                      # the engine
    workers: list[str] | _Absent = ABSENT             # the URLs a router was started with
    secret_templates: dict[str, Any] | _Absent = ABSENT
    helper: str | _Absent = ABSENT                    # the content hash of the helper that wrote the run dir


@dataclass(frozen=True)
class SupervisedSpec:
    """One supervised process: its name, its port(s) (the first one is the one the supervisor names), the line
    that says it is ready, its stop grace, its restart policy and what its record keeps."""

    name: str
    ports: tuple[int, ...]
    ready_pattern: str
    grace_s: float
    restart: Restart
    record: RecordFields
    fatal: FatalWatch | None = None
    logs: Logs | None = None     # engine.log's rotation (the supervisor's defaults when None)
    probe: ProbeConfig | None = None  # the one-token probe after ready (None: none, e.g. a router)

    @property
    def port(self) -> int:
        return self.ports[0]


def supervise_config(spec: SupervisedSpec) -> SuperviseConfig:
    """supervise.json of the process."""
    restart = spec.restart
    config: SuperviseConfig = {"launch": LAUNCH_SH, "env_file": ENV_FILE, "log": ENGINE_LOG, "grace_s": spec.grace_s,
                               "port": spec.port, "name": spec.name, "ready_pattern": spec.ready_pattern}
    if spec.fatal is not None:
        config["fatal_patterns"] = list(spec.fatal.patterns)
        config["fatal_grace_s"] = spec.fatal.grace_s
    config["restart"] = {"policy": restart.policy, "max": restart.max, "backoff_s": list(restart.backoff_s),
                         "window_s": restart.window_s}
    # keys the previous release did not write: only when they differ from the supervisor's own defaults, so a
    # default profile's supervise.json stays byte for byte the previous release's (tests/unit/records)
    if restart.stable_s != DEFAULT_RESTART["stable_s"]:
        config["restart"]["stable_s"] = restart.stable_s
    if restart.drain_s:
        config["restart"]["drain_s"] = restart.drain_s
    if restart.on_boot:
        config["on_boot"] = True
    if spec.logs is not None:
        logs: LogsConfig = {"max_bytes": spec.logs.max_bytes, "head_bytes": spec.logs.head_bytes,
                            "keep": spec.logs.keep}
        if dict(logs) != DEFAULT_LOGS:
            config["logs"] = logs
    if spec.probe is not None:
        config["probe"] = spec.probe
    return config


def process_record(spec: SupervisedSpec, bundle: Bundle, *, attempt: int, up_id: str) -> ProfileRecord:
    """profile.json of one attempt of the process (secrets masked: the bundle's env and the spec's profile)."""
    fields = spec.record
    present = [("name", spec.name), ("role", fields.role), ("fleet", fields.fleet),
               ("content_hash", bundle.content_hash), ("settings_hash", fields.settings_hash),
               ("attempt", attempt), ("up_id", up_id), ("written_hash", fields.written_hash),
               ("argv", bundle.argv), ("env", bundle.masked_env), ("port", spec.port),
               ("health_path", fields.health_path), ("kind", fields.kind), ("workers", fields.workers),
               ("profile", fields.profile), ("secret_templates", fields.secret_templates),
               ("pushed_at", time.time()), ("helper", fields.helper)]
    return cast(ProfileRecord, {key: value for key, value in present if value is not ABSENT})
