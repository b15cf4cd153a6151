"""The Deployment interface: what every kind of deployment (single host, replica fleet, node group) answers.

Methods return typed reports (deployer.deployments.reports, or the runner's own UpReport / FleetReport /
SmokeReport); nothing here prints. A method a kind cannot do raises a ProfileError saying so in one line.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from deployer.deployments.top import TopReport
from deployer.errors import ProfileError
from deployer.operate.deployment import DownOptions, LogOptions

if TYPE_CHECKING:
    from deployer.deployments.reports import (DiagnosisReport, DownReport, HistoryReport, PlanReport,
                                              PruneReport, StatusReport, UpResult)
    from deployer.profile.model import Profile
    from deployer.deployments.reports import SmokeResult
    from deployer.export.prometheus import AddressOf, PromExport
    from deployer.prepare.report import PrepareReport
    from deployer.smoke import SmokeOptions
    from deployer.runner.up import UpOptions
    from deployer.events import EventSink
    from deployer.box.snapshot import LogWindow
    from deployer.operate.upgrade.outcome import Upgraded
    from deployer.operate.upgrade.plan import UpgradeOptions

Out = Callable[[str], None]
__all__ = ["Deployment", "DownOptions", "ExportSource", "LogOptions", "Out", "PruneOptions", "Select"]


@dataclass(frozen=True)
class Select:
    """Which part of a deployment a command means: one node of a group (--node), one member of a fleet
    (--replica N, --router, or the member on --host)."""

    node: int | None = None
    replica: int | None = None
    router: bool = False

    @property
    def whole(self) -> bool:
        return self.node is None and self.replica is None and not self.router


@dataclass(frozen=True)
class ExportSource:
    """The profile to export and the run it was read from (None: the profile file itself)."""

    profile: Profile
    run_id: str | None = None


@dataclass(frozen=True)
class PruneOptions:
    keep: int | None = None
    dry_run: bool = False


class Deployment(ABC):
    """One deployment, whatever its kind. `name` is the deployment's name (None: every deployment on a host)."""

    name: str | None
    #: events carry a `member` tag (fan-out over several hosts): progress is shown per member
    tagged_events: bool = False

    @abstractmethod
    def up(self, opts: UpOptions, emit: EventSink) -> UpResult: ...

    @abstractmethod
    def render(self, as_json: bool = False, note: Out | None = None) -> str:
        """The launch this deployment renders to (every node's for a group), as text or JSON; secrets never
        shown. The flags are translated for the engine version the target runs when the local cache knows it
        (deployer.preflight.known); `note` gets a line saying which version, and why, or that none is known."""

    @abstractmethod
    def plan(self, model_config: Path | None = None) -> PlanReport: ...

    @abstractmethod
    def status(self) -> StatusReport: ...

    @abstractmethod
    def logs(self, opts: LogOptions, out: Out) -> None: ...

    @abstractmethod
    def history(self) -> HistoryReport: ...

    @abstractmethod
    def diagnose(self, engine_version: str | None = None) -> DiagnosisReport: ...

    @abstractmethod
    def down(self, opts: DownOptions = DownOptions()) -> DownReport: ...

    @abstractmethod
    def restart(self, opts: UpOptions, emit: EventSink) -> UpResult: ...

    @abstractmethod
    def rollback(self, opts: UpOptions, emit: EventSink) -> UpResult: ...

    @abstractmethod
    def prune(self, opts: PruneOptions = PruneOptions()) -> PruneReport: ...

    @abstractmethod
    def smoke(self, opts: SmokeOptions, emit: EventSink) -> SmokeResult: ...

    # Room for the commands other issues add (top, ls, the dashboard's reads): a kind that has not built one
    # says so.
    def prepare(self, emit: EventSink) -> PrepareReport:
        """What a launch needs on every host (the compatibility checks, the managed environment), without
        launching: for images and CI (`deploy prepare`)."""
        raise self._not_built("prepare")

    def upgrade(self, opts: UpgradeOptions, apply_it: bool, emit: EventSink) -> Upgraded:
        """`deploy upgrade`: what moving to `opts.release` changes (the plan, the upgraded profile), and with
        `apply_it` the switch, kept only when the new release passes its gates."""
        raise self._not_built("upgrade")

    def top(self) -> TopReport:
        """One row per engine (replica, node) with its serving numbers: the status report, row by row."""
        return TopReport.of(self.name, self.status())

    def ls(self) -> object:
        raise self._not_built("ls")

    def known_profile(self) -> Profile | None:
        """The profile this deployment was named by (None: a name on a host, nothing loaded)."""
        return getattr(self, "profile", None)

    def member(self, select: Select) -> Deployment:
        """The one-host deployment a part of this one is (a fleet's replica or router, a group's node), on which
        history, logs and the log window of that part are read; the whole of a single host is itself."""
        if select.whole:
            return self
        raise self._not_built("choosing a member")

    def log_window(self, offset: int | None, max_bytes: int) -> LogWindow | None:
        """Up to `max_bytes` of the current engine log from byte `offset` (None: the last `max_bytes`), raw (mask
        each line shown with secrets.mask_text: the run's secrets are learnt here); None: no log yet."""
        raise self._not_built("the log window")

    def export_source(self) -> ExportSource:
        """What `deploy export` translates: the profile this deployment was made from, or (a name on a host) the
        profile of its newest run that reached ready."""
        raise self._not_built("export")

    def scrape_targets(self, address_of: AddressOf | None = None) -> PromExport:
        """What `deploy export prometheus` writes: every server this deployment runs as a scrape target (each kind
        knows its servers: deployer.export.prometheus), its address written by `address_of` (default: the host
        as the profile writes it)."""
        raise self._not_built("export prometheus")

    def _not_built(self, what: str) -> ProfileError:
        return ProfileError(f"{self.name or 'this deployment'}: {what} is not built for this kind of deployment")
