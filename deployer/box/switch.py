"""Switching a deployment to a pushed run dir, the one way every start goes (the attempt runner's attempts, the
restore path's bring-back, the router): stop what served, wait for the process's ports, point `current` at the
new run, start it.

Why `current` moves only after the port wait, right before the start: `current` names the run that may be
running, and everything that acts on "the deployment" goes through it (`status`, `logs`, `down`, `restart`, the
next `up`'s view of what serves, and restore, which stops whatever the failed attempt left running by reading
`current`). Moved before the wait, it would name a run that was never started for up to the wait's length; a
port that stays busy, a dropped connection or a Ctrl-C in that window would leave `current` on a run without
state (status: absent, restart: nothing to restart) while the run it named before (stopped, or an earlier
attempt's that may still linger and is what holds the port) is named by nothing, so neither `down` nor restore
would reach it. Moved after the wait, a failure there leaves `current` on the run that last ran, stopped:
`status` says so truthfully, `restart` brings back a version that started before, restore finds the failed
attempt's run where it looks. Between `set_current` and `start` nothing waits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from deployer.remote.base import Remote
from deployer.box.process import Launch, check_port, start, stop
from deployer.box.push import Layout, RunDir, set_current


class Process(Protocol):
    """What a switch needs of a supervised process: its ports and its stop grace (a `SupervisedSpec` is one)."""

    @property
    def ports(self) -> tuple[int, ...]: ...

    @property
    def grace_s(self) -> float: ...


@dataclass(frozen=True)
class Ports:
    """A process known by its ports only (an engine's run, a run brought back from its record); `grace_s` is
    used only when the switch itself stops what served."""

    ports: tuple[int, ...]
    grace_s: float = 0.0


def switch_to(remote: Remote, layout: Layout, run: RunDir, spec: Process, *, serving: RunDir | None,
              port_wait_s: float, stopped: bool = False) -> Launch:
    """Stop `serving` (if any, with the spec's grace), check every port of the spec is free, make `run` current
    and start it. The check waits up to port_wait_s for the ports when something was stopped just before, here
    (`serving`) or by the caller (`stopped`: a node group stops every node before any starts, a retry follows its
    own failed run, restore the failed attempt); otherwise it looks once (PortBusy when one is taken)."""
    if serving is not None:
        stop(remote, serving, spec.grace_s)
    wait = port_wait_s if serving is not None or stopped else 0.0
    for port in spec.ports:
        check_port(remote, layout, port, wait_s=wait)
    set_current(remote, layout, run)
    return start(remote, run)
