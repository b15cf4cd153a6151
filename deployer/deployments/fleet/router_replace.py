"""Replacing a router whose settings changed: the old router stopped, the new one (its run dir already pushed)
started, never left half done.

Before the stop a guard is armed on the router's host (box/process.py `arm_repair` with `start_new`,
deployer/supervisor/guard.py): after kill -9 of this client between the stop and the start it takes the
lock over, starts the new router (its run dir is complete: pushed before the guard was armed), or the old one again
when the new one does not come up, records the repair in the lock's history and releases the lock. A Ctrl-C or
SIGTERM in that window finishes the switch here, within the interrupt's bound (deployer/interrupts.py), before
deployer leaves; a normal end and a failure disarm the guard. The old router is stopped `--why replace`, so while
nothing routes `deploy status` says `interrupted` (never `stopped`, never serving).

A new router that does not come up while this client is alive (it cannot start, or dies before it answers) is
stopped and the old one started again (`fall_back`), so a failed settings change leaves the fleet routed as
before, and the failure is said with that.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from deployer import interrupts
from deployer.errors import DeployError, LaunchFailed
from deployer.events import EventSink, Info
from deployer.remote.base import Remote
from deployer.runner.interrupted import START_S
from deployer.runner.timing import PORT_WAIT_S
from deployer.box.process import ReplaceGuard, arm_repair, disarm_repair, start, status, stop
from deployer.box.push import Layout, RunDir, set_current
from deployer.box.records import RunView
from deployer.box.supervised import SupervisedSpec
from deployer.box.switch import switch_to

FALL_BACK_S = 60.0   # for the previous router to answer again (as the guard's fallback waits)


def replace_router(remote: Remote, layout: Layout, run: RunDir, spec: SupervisedSpec, serving: RunView,
                   emit: EventSink) -> None:
    """Stop the router `serving`, start `run` (guarded; see the module's docstring)."""
    armed = arm_repair(remote, layout, ReplaceGuard(run, serving.run, spec.grace_s, spec.ports, start_new=True))
    emit(Info(message=f"replacing the router {serving.content_hash[:12]} ({serving.run.run_id})"))
    try:
        try:
            _switch(remote, layout, run, spec, serving.run)
        except KeyboardInterrupt:
            _finish(remote, layout, run, spec, serving.run, emit)
            raise
    finally:
        if armed:
            try:
                disarm_repair(remote, layout)
            except DeployError:
                pass  # the guard leaves by itself once the lock is released (not the client's lease any more)


def _switch(remote: Remote, layout: Layout, run: RunDir, spec: SupervisedSpec, serving: RunDir) -> None:
    stop(remote, serving, spec.grace_s, why="replace")
    switch_to(remote, layout, run, spec, serving=None, port_wait_s=PORT_WAIT_S, stopped=True)


def _finish(remote: Remote, layout: Layout, run: RunDir, spec: SupervisedSpec, serving: RunDir,
            emit: EventSink) -> None:
    """Interrupted between the stop and the start: the new router started (a stop still in progress ends first)."""
    interrupts.allow(spec.grace_s + PORT_WAIT_S + START_S)
    try:
        now = status(remote, run)
        if now.get("alive") or now.get("supervisor_alive"):
            return  # started already: nothing is half done
        _switch(remote, layout, run, spec, serving)
    except DeployError as err:
        emit(Info(message=f"interrupted: the new router was not started: {err.message}; the router is stopped "
                          "until the next `deploy up` of the fleet"))
        return
    emit(Info(message=f"interrupted: started the new router ({run.run_id}) before leaving; it is loading"))


def fall_back(remote: Remote, layout: Layout, new: RunDir, old: RunDir, grace_s: float, failure: DeployError,
              answers: Callable[[], bool], emit: EventSink) -> DeployError:
    """The new router `new` did not come up (`failure`): it is stopped and the old router `old` made current and
    started again, until `answers` (bounded). The error to raise: `failure`, saying which router serves now."""
    try:
        stop(remote, new, grace_s, why="failed")
        set_current(remote, layout, old)
        start(remote, old)
        end = time.monotonic() + FALL_BACK_S
        while not answers():
            if time.monotonic() > end:
                raise LaunchFailed(f"it does not answer after {FALL_BACK_S:g}s")
            time.sleep(0.25)
    except DeployError as err:
        return LaunchFailed(f"{failure.message}; the previous router ({old.run_id}) could not be started again "
                            f"either: {err.message}; the router is stopped until the next `deploy up` of the fleet")
    emit(Info(message=f"the new router did not come up: started the previous one ({old.run_id}) again"))
    return LaunchFailed(f"{failure.message}; the previous router ({old.run_id}) was started again and routes as "
                        "before (the settings change was not applied)")
