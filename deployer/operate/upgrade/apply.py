"""`deploy upgrade --apply` on one host: the old release measured while it serves (the load check), the switch by
`up`'s own replace path (environment and weights ready before anything stops, drain, start, ready by a generated
token; a new release that never becomes ready brings the old one back), the new release measured the same way, and
the gates (`upgrade.gates`) decide: promoted, or switched back to the old release. Each decision, with both
releases' numbers, is an `upgrade` event in the local history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deployer.errors import DeployError, LaunchFailed, Unhealthy
from deployer.events import EventSink
from deployer.local.history import History
from deployer.operate.upgrade.loadcheck import Gate, LoadNumbers, judge, measure
from deployer.operate.upgrade.plan import UpgradePlan
from deployer.profile.model import Profile, Upgrade, UpgradeGates
from deployer.remote.connect import conversing, target_spec
from deployer.runner.up import UpOptions, up


@dataclass
class Applied:
    """What `--apply` did: the decision, both releases' numbers (None: not measured) and each gate."""

    name: str
    old_version: str | None
    new_version: str | None
    decision: str = "not applied"     # promoted | rolled back
    reason: str = ""
    before: LoadNumbers | None = None
    after: LoadNumbers | None = None
    gates: list[Gate] = field(default_factory=list)

    @property
    def promoted(self) -> bool:
        return self.decision == "promoted"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "from": self.old_version, "to": self.new_version, "decision": self.decision,
                "reason": self.reason, "before": None if self.before is None else self.before.to_json(),
                "after": None if self.after is None else self.after.to_json(),
                "gates": [g.to_json() for g in self.gates]}

    def failure(self, release: str) -> DeployError | None:
        """Unhealthy (exit 6) when the old release serves again."""
        return None if self.promoted else Unhealthy(f"the upgrade to {release} was rolled back: {self.reason}")

    def lines(self) -> list[str]:
        out = [f"apply: {self.decision} ({self.reason})"]
        out += [f"  load check {n.line()}" for n in (self.before, self.after) if n is not None]
        out += [f"  gate {g.line()}" for g in self.gates]
        return out


def apply_upgrade(plan: UpgradePlan, original: Profile, trust_new_host: bool, emit: EventSink) -> Applied:
    """Switch `original`'s deployment to `plan.profile` and keep it only if it passes the gates."""
    gates = (original.upgrade or Upgrade()).gates
    done = Applied(original.name, plan.comparison.old.version, plan.comparison.new.version)
    done.before = _measured(original, gates, trust_new_host, done.old_version)
    opts = UpOptions(trust_new_host=trust_new_host, what="upgrade")
    try:
        up(plan.profile, opts, emit)
    except LaunchFailed as exc:   # up's own rollback has brought back what was serving
        _decided(done, "rolled back", f"the new release did not become ready: {exc}")
        raise
    done.after = _measured(plan.profile, gates, trust_new_host, done.new_version)
    if done.before is None:
        return _decided(done, "promoted", "no numbers of the old release to compare (it was not serving)")
    if done.after is None:
        done.gates = []
        return _back(done, original, opts, emit, "the new release does not answer the load check")
    done.gates = judge(done.before, done.after, gates)
    failed = [g for g in done.gates if not g.passed]
    if failed:
        return _back(done, original, opts, emit, "gate " + ", ".join(g.name for g in failed) + " failed")
    return _decided(done, "promoted", "every gate passed")


def _measured(profile: Profile, gates: UpgradeGates, trust_new_host: bool, version: str | None
              ) -> LoadNumbers | None:
    """The load check against what `profile`'s engine port serves; None when nothing answers there as it should."""
    try:
        with conversing(target_spec(profile, trust_new_host)) as remote:
            return measure(remote, profile, gates, version)
    except DeployError:
        return None


def _back(done: Applied, original: Profile, opts: UpOptions, emit: EventSink, why: str) -> Applied:
    """The old release started again (as `up` starts it: watched, ready by a token), then the decision."""
    up(original, UpOptions(trust_new_host=opts.trust_new_host, what="upgrade rollback", force=True), emit)
    return _decided(done, "rolled back", why)


def _decided(done: Applied, decision: str, reason: str) -> Applied:
    done.decision, done.reason = decision, reason
    history = History()
    try:
        history.event(done.name, "upgrade", done.to_json())
    finally:
        history.close()
    return done
