"""An `up` (or `restart`, `rollback`: the same attempts) interrupted by Ctrl-C or SIGTERM after it stopped the
version that served and before its replacement was started: the stopped version is started again before deployer
leaves, in its own run dir (its supervisor takes it from there: no watch), within the interrupt's bound
(deployer/interrupts.py allows the stop's grace, the port wait and the start). A replacement that was started keeps
running (it is not half done: its supervisor runs it); so does everything when the lock is no longer ours. Only a
version that had reached ready is brought back, as after a failure (restore.py). After kill -9 nothing runs here;
the target repairs itself: before the stop, the attempts armed a guard on every target (box/process.py
`arm_repair`, deployer/supervisor/guard.py) which, once the process holding the client's lease is gone
for a few seconds and the replace was not disarmed, takes the lock over, leaves a started replacement running or
else starts the stopped version again, records it in the lock's history and releases the lock. Ctrl-C and SIGTERM
bring back here and then disarm it (so do a normal end and a failure after Restore). Meanwhile, and where no guard
runs, the stopped version's state says the stop was for a replace (`stop --why replace`), so `deploy status`
reports the deployment `interrupted` (exit 5), never `stopped`, and the next `up` or `restart` starts what it
asks for.
"""

from __future__ import annotations

from dataclasses import dataclass

from deployer import interrupts
from deployer.errors import DeployError, LockLost
from deployer.events import EventSink, Info
from deployer.runner.shape import Shape, HeldHost
from deployer.runner.timing import PORT_WAIT_S
from deployer.box.process import check_port, start, status, stop
from deployer.box.push import set_current

START_S = 35.0  # the supervisor's start (30 s at most) and a few round trips


@dataclass
class Interrupted:
    """The targets of an interrupted replace and how long stopping their old version may take."""

    shape: Shape
    grace_s: float
    emit: EventSink

    def bring_back(self) -> None:
        """Start again every target's stopped version whose replacement is not running; say what was done."""
        targets = [t for t in self.shape.targets if t.serving is not None and t.serving.reached_ready]
        if not targets:
            return
        interrupts.allow(self.grace_s + PORT_WAIT_S + START_S)
        try:
            started = [t for t in self.shape.each(self._again, targets) if t is not None]
        except LockLost as lost:
            self.emit(Info(message=f"interrupted: the stopped version was not brought back: {lost.message}"))
            return
        except DeployError as err:
            self.emit(Info(message=f"interrupted: bringing back the stopped version failed: {err.message}"))
            return
        if started:
            view = started[0].serving
            assert view is not None
            self.emit(Info(message=f"interrupted: started the previous version {view.content_hash[:12]} "
                                   f"({view.run.run_id}) again{self.shape.everywhere}; it is loading (see `deploy "
                                   f"status`)"))

    def _again(self, target: HeldHost) -> HeldHost | None:
        view = target.serving
        assert view is not None
        if target.run is not None and target.run.run_id != view.run.run_id and \
                status(target.remote, target.run).get("alive"):
            return None  # the replacement runs: nothing is half done here
        # a stop still in progress on the target ends first; still for the replace (never a `down`'s `stopped`)
        stop(target.remote, view.run, self.grace_s, why="replace")
        set_current(target.remote, target.layout, view.run)
        port = int(view.record.get("port") or 0)
        if port:
            check_port(target.remote, target.layout, port, wait_s=PORT_WAIT_S)
        target.run, target.launch = view.run, start(target.remote, view.run)
        return target
