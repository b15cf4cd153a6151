"""The locked session on one deployment's target: connect (or use an open connection), talk to the helper, make
the deployment dir ready and hold its lock, all released on exit. An engine's `up` (runner/up.py) and the fleet's
router (deployments/fleet/router.py) both deploy inside one."""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from deployer.remote.base import Remote

from deployer.host import TargetSpec
from deployer.remote.connect import conversing
from deployer.box.lock import DeploymentLock
from deployer.box.push import Layout, expand_workdir, prepare


@dataclass(frozen=True)
class DeploymentPlace:
    """Where a deployment lives: the host reached through `target`, the directory `<workdir>/<name>` there."""

    target: TargetSpec
    workdir: str
    name: str

    def layout(self, remote: Remote) -> Layout:
        return Layout(posixpath.join(expand_workdir(remote, self.workdir), self.name))


@contextmanager
def locked_session(place: DeploymentPlace, what: str, notify: Callable[[str], None], *, break_lock: bool = False,
                   connection: Remote | None = None) -> Iterator[tuple[Remote, Layout]]:
    """Connect once (or use `connection`, which stays open: a fleet's one connection per host), start the
    target-side helper, create the deployment dir, hold the deployment lock (`what` names the holder, `notify`
    hears what the lock has to say); release everything on exit.

    The remote handed out acts only while the lock is held: once it is lost, every call raises LockLost."""
    # the one exec channel (the first request rides with it): every step below talks to this helper
    with conversing(place.target, connection) as conv:
        layout = place.layout(conv)
        prepare(conv, layout)
        with DeploymentLock(conv, layout, what, break_lock=break_lock, notify=notify) as lock:
            with lock.reporting_loss():
                yield lock.guarded(), layout
