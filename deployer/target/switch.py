"""Switching a deployment to a pushed run dir: stop what served, wait for the process's ports, point `current`
at the new run, start it. The router (fleet/router.py) starts through here; the attempt runner and the restore
path (runner/) keep their own order (current first, then the port wait) and are not moved here yet."""

from __future__ import annotations

from deployer.remote.base import Remote
from deployer.target.process import Launch, check_port, start, stop
from deployer.target.push import Layout, RunDir, set_current
from deployer.target.supervised import SupervisedSpec


def switch_to(remote: Remote, layout: Layout, run: RunDir, spec: SupervisedSpec, *, serving: RunDir | None,
              port_wait_s: float) -> Launch:
    """Stop `serving` (if any, with the spec's grace), check every port of the spec is free (waiting up to
    port_wait_s for them when something was stopped; PortBusy otherwise), make `run` current and start it."""
    if serving is not None:
        stop(remote, serving, spec.grace_s)
    wait = port_wait_s if serving is not None else 0.0
    for port in spec.ports:
        check_port(remote, layout, port, wait_s=wait)
    set_current(remote, layout, run)
    return start(remote, run)
