"""What this machine knows without naming one deployment: every deployment its local history has (`deploy ls`,
across hosts; `--live` asks each host), and the user's effective defaults with where each came from
(`deploy config`)."""

from __future__ import annotations

import posixpath
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deployer.deployments.reports import HostStatus, Row
from deployer.errors import DeployError
from deployer.local.settings import KEYS, Setting, load_config, strong_default, weak_default

if TYPE_CHECKING:
    from deployer.local.lookup import Known


@dataclass(frozen=True)
class KnownReport:
    """`deploy ls`: one row per deployment, host and workdir, newest first (`live`: each host was asked)."""

    rows: list[Row]
    live: bool = False
    nothing_found: str | None = None  # `ls --host`: where it looked, when it found nothing

    def to_json(self) -> Any:
        return self.rows

    def lines(self) -> list[str]:
        """A table (NAME HOST WORKDIR VERSION STATE WHEN, and NOW with `live`); with no row, a line saying the local
        history is empty, or none where `ls --host` said on stderr where it looked."""
        if not self.rows:
            return [] if self.nothing_found else ["no deployments in the local history (deploy up records them)"]
        head = ["NAME", "HOST", "WORKDIR", "VERSION", "STATE", "WHEN"] + (["NOW"] if self.live else [])
        table = [head] + [_known_cells(row, self.live) for row in self.rows]
        widths = [max(len(r[i]) for r in table) for i in range(len(head))]
        return ["  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip() for cells in table]

    exit_code = 0


def _known_cells(row: Row, live: bool) -> list[str]:
    from deployer.deployments.status_text import ago, when

    at = row.get("at")
    seen = f"{when(at)} ({ago(max(time.time() - at, 0))} ago)" if isinstance(at, (int, float)) else "?"
    cells = [str(row["name"]), str(row["host"]), str(row["workdir"]), str(row.get("version") or "")[:12],
             str(row.get("state")), seen]
    if live:
        now = row.get("live") or {}
        cells.append(f"unknown: {now['error']}" if now.get("error") else
                     f"{now.get('status')} ({'healthy' if now.get('healthy') else 'not healthy'})")
    return cells


@dataclass(frozen=True)
class ConfigReport:
    """`deploy config`: the effective host, workdir and engine python, each with its source."""

    settings: list[Setting]
    config_file: str
    exists: bool

    def to_json(self) -> Any:
        return {"config_file": self.config_file, "exists": self.exists,
                "settings": [s.to_json() for s in self.settings]}

    def lines(self) -> list[str]:
        state = "" if self.exists else " (not there: no defaults from it)"
        return [f"config file: {self.config_file}{state}",
                *(f"{s.name:<14} {s.value if s.value is not None else '(none)':<30} from {s.source}"
                  for s in self.settings)]

    exit_code = 0


def known_deployments(live: bool = False) -> KnownReport:
    """The local history's deployments; with `live`, each one's status read from its host now."""
    from deployer.local.lookup import known

    rows = []
    for entry in known():
        row: Row = entry.to_json()
        if live:
            row["live"] = _live(entry)
        rows.append(row)
    return KnownReport(rows, live)


def deployments_on(host: str, workdir: str | None = None, trust_new_host: bool = False) -> KnownReport:
    """`ls --host H`: what H has now under the workdir given (or the default) and every workdir the local history
    knows there, one row each; WHEN from the local history where it knows the deployment."""
    from deployer.deployments.resolve import resolve
    from deployer.local.lookup import known

    status = resolve(None, host, workdir, trust_new_host=trust_new_host).status()
    assert isinstance(status, HostStatus)
    seen = {(k.name, k.workdir): k.at for k in known() if k.matches_host(host)}
    rows: list[Row] = []
    for row in status.rows:
        where = posixpath.dirname(posixpath.dirname(posixpath.dirname(row.run_dir)))  # <workdir>/<name>/runs/<id>
        rows.append({"name": row.name, "host": row.host, "workdir": where, "version": row.content_hash,
                     "state": row.status, "at": seen.get((row.name, where)), "run_id": posixpath.basename(row.run_dir)})
    return KnownReport(rows, nothing_found=status.nothing_found)


def _live(entry: Known) -> Row:
    """One deployment's state on its host now (an unreachable host or a gone deployment says so, one line)."""
    from deployer.deployments.single.deployment import SingleHost
    from deployer.operate.deployment import Ref

    ref = Ref(entry.name, entry.spec(), entry.workdir)
    try:
        report = SingleHost(lambda: ref).status().to_json()
    except DeployError as exc:
        return {"status": "unknown", "healthy": False, "error": str(exc)}
    row = report[0] if isinstance(report, list) else report
    return {"status": row.get("status"), "healthy": bool(row.get("healthy")), "error": None}


def effective_settings(profile: str | None = None, host: str | None = None,
                       workdir: str | None = None) -> ConfigReport:
    """Each default as a command would take it: the command line, the environment, the profile (when one is
    given), the config file, the built-in value."""
    config = load_config()
    loaded = _profile_sources(profile, host) if profile else {}
    cli = {"host": host, "workdir": workdir, "engine_python": None}
    labels = {"host": "--host", "workdir": "--workdir", "engine_python": "--set engine.python"}
    out = []
    for key in KEYS:
        strong = strong_default(key.name, cli[key.name], labels[key.name])
        out.append(loaded.get(key.name) or strong or weak_default(key.name, config))
    return ConfigReport(out, str(config.path), config.digest is not None)


def _profile_sources(path: str, host: str | None) -> dict[str, Setting]:
    """What a profile file ends up with for each default (the loader applies the same precedence) and where
    each value was written."""
    from deployer.profile.loader import READ_ONLY, load_profile

    prof = load_profile(path, host=host, allow_unset=READ_ONLY)
    if prof.replicas is not None or prof.nodes is not None:
        values = {"engine_python": prof.engine.python}
    else:
        values = {"host": prof.target.host, "workdir": prof.target.workdir, "engine_python": prof.engine.python}
    out = {}
    for key in KEYS:
        if key.name not in values:
            continue
        file, line = prof.written(key.field)
        source = "built-in" if file is None else _source_label(file, line)
        out[key.name] = Setting(key.name, values[key.name], source)
    return out


def _source_label(file: str, line: int | None) -> str:
    if file.startswith(("--", "env ")):
        return file
    config = load_config()
    kind = "config" if file == str(config.path) else "profile"
    return f"{kind} {file}:{line}" if line else f"{kind} {file}"
