"""Deployments this machine knows (its local history): which host and workdir a bare NAME means when the command
line does not say, and the list `deploy ls` shows.

A NAME with neither --host nor DEPLOYER_HOST is looked up here: exactly one host and workdir -> that one (said on
stderr); several -> one line listing them (exit 2); none -> the config file's host, if any. A NAME with --host
but no --workdir takes the workdir the local history knows for it on that host, when there is exactly one.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deployer.errors import ProfileError
from deployer.local.history import History, LatestRow
from deployer.host import TargetSpec

Notify = Callable[[str], None]


def _stderr(message: str) -> None:
    sys.stderr.write(f"deploy: {message}\n")
    sys.stderr.flush()


@dataclass(frozen=True)
class Known:
    """A deployment on a host and workdir, as this machine last saw it."""

    row: LatestRow

    @property
    def name(self) -> str:
        return self.row.deployment

    @property
    def workdir(self) -> str:
        return str(self.row.target.get("workdir") or "")

    @property
    def at(self) -> float:
        return self.row.ended_at or self.row.started_at

    def spec(self, trust_new_host: bool = False) -> TargetSpec:
        t = self.row.target
        port = t.get("port")
        return TargetSpec(host=str(t.get("host") or self.row.host), user=t.get("user") or None,
                          port=int(port) if isinstance(port, int) else None,
                          identity_file=t.get("identity_file") or None, known_hosts=t.get("known_hosts") or None,
                          trust_new_host=trust_new_host)

    def matches_host(self, host: str) -> bool:
        """--host as given: the connection's label, or the host as the profile wrote it (an ssh alias)."""
        t = self.row.target
        return host in (self.row.host, t.get("host"), f"{t.get('user')}@{t.get('host')}")

    def choice(self) -> str:
        return f"--host {self.row.host} --workdir {self.workdir}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "host": self.row.host, "workdir": self.workdir,
                "version": self.row.content_hash, "run_id": self.row.run_id,
                "state": self.row.outcome or "unfinished", "at": self.at}


def known(name: str | None = None) -> list[Known]:
    """Every deployment (or NAME's) on every host and workdir this machine ran, newest first."""
    store = History()
    try:
        return [Known(row) for row in store.latest(name) if row.target.get("workdir")]
    finally:
        store.close()


def workdirs_on(host: str) -> list[str]:
    """The workdirs the local history knows deployments under on HOST (as --host names it), newest first: where a
    host-wide `status`, `top` or `ls` looks besides the workdir the command line (or the default) gives."""
    return list(dict.fromkeys(k.workdir for k in known() if k.matches_host(host)))


@dataclass(frozen=True)
class Located:
    spec: TargetSpec | None  # None: the host given (--host, DEPLOYER_HOST) stands
    workdir: str | None      # None: no workdir known here


def locate(name: str, host: str | None, workdir: str | None, trust_new_host: bool = False,
           notify: Notify = _stderr) -> Located:
    """Where the local history says NAME is, for what the command line left open (host, workdir); see the
    module's rules. Raises ProfileError (exit 2) when it knows NAME in several places."""
    entries = [k for k in known(name) if (host is None or k.matches_host(host))
               and (workdir is None or k.workdir == workdir)]
    if not entries:
        return Located(None, None)
    places = {(k.row.host, k.workdir) for k in entries}
    if len(places) > 1:
        where = "; ".join(sorted(k.choice() for k in entries))
        raise ProfileError(f"{name!r} is known in {len(places)} places in the local history: {where} (give --host "
                           "and --workdir)")
    only = entries[0]
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(only.at))
    used = [f"host {only.row.host}"] if host is None else []
    if workdir is None:
        used.append(f"workdir {only.workdir}")
    notify(f"{name}: {', '.join(used)} (from the local history: last up {when})")
    return Located(only.spec(trust_new_host) if host is None else None, only.workdir)
