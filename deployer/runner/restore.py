"""Bring back the previous version: after a failed replace, the version that served is started again, and the
error says what happened.

Only when `up` stopped it and it had reached ready on every target (push first, stop last). What the failed
attempt left running is stopped first (found by `current`, which names the run that last started), then every
target is switched back to its earlier run dir in place, its own files and ports (box/switch.py: the ports,
then `current`, then the start), and it is watched like any attempt. `--no-rollback` and a lost lock leave it as
it failed; the error says so either way. One path for a single host and a node group.
"""

from __future__ import annotations

from dataclasses import dataclass

from deployer.errors import DeployError, DiskFull, LockLost
from deployer.events import EventSink, Restored, RollingBack
from deployer.profile.model import Profile
from deployer.runner.report import RestoredVersion, UpReport
from deployer.runner.shape import Result, Shape, HeldHost, result_name, result_text
from deployer.runner.timing import PORT_WAIT_S, stop_grace
from deployer.box.process import status, stop
from deployer.box.records import current_run_id
from deployer.box.switch import Ports, switch_to
from deployer.watch.watcher import Ready


def amend(exc: DeployError, note: str) -> None:
    """Add what happened afterwards to the error being reported."""
    exc.message = f"{exc.message}; {note}"
    exc.args = (exc.message,)


@dataclass
class Restore:
    """The version that served on `shape`'s targets, brought back with `profile`'s health and ports as fallback."""

    shape: Shape
    profile: Profile
    ports: list[int]          # each target's port, where its earlier run's record does not say
    emit: EventSink

    def possible(self) -> bool:
        return all(t.serving is not None and t.serving.reached_ready for t in self.shape.targets)

    def bring_back(self, exc: DeployError, report: UpReport, *, rollback: bool) -> None:
        """Start the version that served again (if it may), and amend `exc` with what happened."""
        first = self.shape.leader.serving
        if first is None or not self.possible():
            return
        name = f"{first.content_hash[:12]} ({first.run.run_id})"
        if not rollback:
            return amend(exc, f"the previous version {name} was not brought back (--no-rollback)")
        if isinstance(exc, LockLost):  # whoever holds the lock now owns the target: change nothing more
            return amend(exc, f"the previous version {name} was not brought back (the lock is no longer ours)")
        where = self.shape.everywhere
        self.emit(RollingBack(message=f"bringing back the previous version {name}{where}", run_id=first.run.run_id,
                              content_hash=first.content_hash, reason=exc.message))
        report.restored = restored = RestoredVersion(first.run.run_id, first.content_hash, first.run.path)
        try:
            result = self._restart()
        except LockLost as lost:  # taken over meanwhile (the target refused the start): that is what to report
            amend(lost, f"the previous version {name} was not brought back")
            raise lost from exc
        except DeployError as err:
            restored.status, restored.detail = "failed", err.message
            return amend(exc, f"bringing back the previous version {name} failed too: {err.message}")
        restored.status, restored.detail = result_name(result), result_text(result)
        if isinstance(result, Ready):
            self.emit(Restored(message=f"the previous version {name} is serving again{where}",
                               run_id=first.run.run_id, content_hash=first.content_hash))
            return amend(exc, f"brought back the previous version {name}: it is serving again")
        if isinstance(exc, DiskFull):  # its "exit code None" says only that its supervisor could not write either
            return amend(exc, f"brought back the previous version {name}, but it died too: the disk is still full")
        amend(exc, f"brought back the previous version {name}, but it did not become ready: {restored.detail}")

    def _restart(self) -> Result:
        """Stop what the failed attempt left running, start every earlier run dir again in place, watch it."""
        self.shape.each(self._stop_failed, self.shape.targets)
        self.shape.each(self._start_again, list(zip(self.shape.targets, self.ports)))
        return self.shape.watch_previous(self.profile, self.emit)

    def _stop_failed(self, target: HeldHost) -> None:
        assert target.serving is not None
        failed = current_run_id(target.remote, target.layout)
        if failed and failed != target.serving.run.run_id and \
                status(target.remote, target.layout.run(failed)).get("alive"):
            stop(target.remote, target.layout.run(failed), stop_grace(self.profile.restart.grace_s))

    @staticmethod
    def _start_again(pair: tuple[HeldHost, int]) -> None:
        target, port = pair
        view = target.serving
        assert view is not None
        ports = Ports((int(view.record.get("port") or port),))
        target.run, target.launch = view.run, switch_to(target.remote, target.layout, view.run, ports,
                                                        serving=None, port_wait_s=PORT_WAIT_S, stopped=True)
