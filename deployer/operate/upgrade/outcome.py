"""What `deploy upgrade` did, whatever the kind of deployment (`Deployment.upgrade`): the plan, the profile
`--save` writes it against, and what `--apply` decided (a single host's load check and gates, a fleet's canary),
each of which says itself as text, as JSON, and as the error the command exits with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from deployer.errors import DeployError, PreflightFailed, ProfileError
from deployer.operate.upgrade.plan import UpgradePlan
from deployer.operate.upgrade.save import save_upgraded
from deployer.profile.model import Profile


class Decided(Protocol):
    """What `--apply` decided."""

    def to_json(self) -> dict[str, Any]: ...

    def lines(self) -> list[str]: ...

    def failure(self, release: str) -> DeployError | None:
        """The error the command exits with (None: the new release serves)."""


@dataclass
class Upgraded:
    """The plan (its profile: the upgraded one of the deployment), the profile it was made from (the file `--save`
    starts from), `python` as given, and the decision of `--apply` (None: not asked, or the plan was not ok)."""

    plan: UpgradePlan
    original: Profile
    python: str | None
    applied: Decided | None = None

    def to_json(self) -> dict[str, Any]:
        return {**self.plan.to_json(), **({"apply": self.applied.to_json()} if self.applied is not None else {})}

    def text(self) -> str:
        return self.plan.text() + "".join(f"{line}\n" for line in (self.applied.lines() if self.applied else []))

    def save(self, dest: Path) -> None:
        save_upgraded(self.plan, self.original, dest, self.python)

    def check(self, release: str, apply_it: bool) -> None:
        """Raise what the command exits with: a refused flag (2), not applied (4), the apply's failure."""
        refused = self.plan.comparison.refused
        if refused:
            raise ProfileError(f"the upgrade to {release} is refused: {refused[0].line()}")
        if apply_it and self.applied is None:
            raise PreflightFailed([f"not applied: {p}" for p in self.plan.new.problems])
        failure = self.applied.failure(release) if self.applied is not None else None
        if failure is not None:
            raise failure
