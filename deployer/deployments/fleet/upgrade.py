"""`deploy upgrade FLEET --engine KIND==VERSION`: the upgrade planned on the first replica's host (every replica
runs the same engine: its single-host profile, members.py), its changes carried to the fleet profile itself
(deployer.operate.upgrade.carry), and with `--apply` the upgraded fleet rolled out through the canary
(canary.py `run_canary`): promoted replica by replica, or the canary rolled back, with the verdict's numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deployer.errors import DeployError, PartlyFailed
from deployer.events import EventSink
from deployer.deployments.fleet.canary import CanaryResult, check_canary, run_canary
from deployer.deployments.fleet.members import AddressOf, fleet_of
from deployer.remote.connect import ssh_address
from deployer.operate.upgrade.carry import carried
from deployer.operate.upgrade.outcome import Upgraded
from deployer.operate.upgrade.plan import UpgradeOptions, upgrade_plan
from deployer.profile.model import Profile
from deployer.runner.fanout import TaggedSink
from deployer.runner.report import UpOptions

PROMOTED = ("promoted", "unchanged")


@dataclass(frozen=True)
class CanaryApplied:
    """What `--apply` did to a fleet: the canary rollout's outcome, its verdict with the numbers, the report."""

    result: CanaryResult

    def to_json(self) -> dict[str, Any]:
        r = self.result
        return {"decision": r.outcome, "reason": r.error or "", "report": r.report.to_json()}

    def lines(self) -> list[str]:
        r = self.result
        out = [f"apply: canary {r.outcome}" + (f" ({r.error})" if r.error else "")]
        if r.verdict is not None:
            out.append(f"  {r.verdict.summary()}")
            out += [f"  check {c.line()}" for c in r.verdict.checks]
        out += [f"  r{x.index}@{x.host}: {x.status}" for x in r.report.replicas]
        return out

    def failure(self, release: str) -> DeployError | None:
        """As `deploy up --canary` exits: the report settled (a rolled-back canary, the others serving: exit 9)."""
        if self.result.outcome in PROMOTED:
            return None
        try:
            self.result.report.settle()
        except DeployError as exc:
            return exc
        return PartlyFailed(f"the upgrade to {release}: {self.result.error or self.result.outcome}",
                            outcome=self.result.report)


def upgrade_fleet(profile: Profile, opts: UpgradeOptions, trust_new_host: bool, apply_it: bool, emit: EventSink,
                  address_of: AddressOf = ssh_address) -> Upgraded:
    """The plan on replica 0's host, carried to `profile`; with `apply_it` (and a plan that is ok) the canary."""
    fleet = fleet_of(profile, address_of)
    if apply_it:
        check_canary(fleet)   # nothing touched, nothing built: a fleet without a router cannot be judged
    first = fleet.replicas[0]
    planned = upgrade_plan(first.profile, opts, trust_new_host, TaggedSink(emit).tagged(first.host, f"r{first.index}"))
    done = Upgraded(carried(planned, profile, opts.python), profile, opts.python)
    if apply_it and done.plan.ok:
        up = UpOptions(trust_new_host=trust_new_host, what="upgrade", model_config=opts.model_config)
        done.applied = CanaryApplied(run_canary(done.plan.profile, up, emit, address_of=address_of))
    return done
