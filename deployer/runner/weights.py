"""The weights step of `up` (and of `deploy prepare`): before the launch is rendered and before anything is stopped,
the hub repo `engine.weights` names is fetched on every host of the run, once per host and at once on all of them
(deployer/target/weights.py); the profile comes back pinned to the commit fetched (deployer/prepare/weights.py).

Called by runner/up.py (one host; a fleet's members each through it, and two members on one host share one fetch:
the target-side lock) and by nodes/up.py (every node), always before the attempt runner stops what served.
`prepare_weights` and `plan_weights` are the hooks for `deploy prepare` (fetch, no launch) and `deploy plan` (what
the fetch would take: size, missing bytes, free disk).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from deployer.errors import TargetError
from deployer.events import EventSink, Info
from deployer.prepare.weights import Fetched, Needed, pinned, plan_for
from deployer.profile.model import Profile
from deployer.remote.base import Remote
from deployer.target.weights import fetch, needed


def fetch_weights(remotes: Sequence[Remote], profile: Profile, emit: EventSink,
                  each: Callable[[Callable[[int], Fetched], list[int]], list[Fetched]] | None = None,
                  sink: Callable[[EventSink, int], EventSink] | None = None) -> tuple[Profile, list[Fetched]]:
    """`profile` pinned to the commit fetched on every host of `remotes` (once per host label, at once through
    `each`; `sink`: where the events of the i-th remote go); unchanged, with nothing fetched, when the profile has
    no `engine.weights`."""
    plan = plan_for(profile)
    if plan is None:
        return profile, []
    firsts: dict[str, int] = {}
    for index, remote in enumerate(remotes):
        firsts.setdefault(remote.label, index)

    def one(index: int) -> Fetched:
        return fetch(remotes[index], plan, sink(emit, index) if sink is not None else emit)

    done = (each or _serial)(one, list(firsts.values()))
    commits = {f.commit for f in done}
    if len(commits) != 1:  # a branch that moved between two hosts' listings: the group would load different weights
        raise TargetError(f"{plan.describe()} named different commits on the hosts ({', '.join(sorted(commits))})",
                          hint="set engine.weights.revision to a commit")
    for index, item in zip(firsts.values(), done):
        (sink(emit, index) if sink is not None else emit)(Info(message=item.describe()))
    return pinned(profile, done[0].commit), done


def _serial(work: Callable[[int], Fetched], items: list[int]) -> list[Fetched]:
    return [work(item) for item in items]


def prepare_weights(remote: Remote, profile: Profile, emit: EventSink) -> Fetched | None:
    """The hook for `deploy prepare`: fetch the profile's weights on its host without launching anything."""
    _, done = fetch_weights([remote], profile, emit)
    return done[0] if done else None


def plan_weights(remote: Remote, profile: Profile) -> Needed | None:
    """The hook for `deploy plan`: what the fetch would take on the profile's host (commit, size, missing, free
    disk), nothing fetched; None without `engine.weights`."""
    plan = plan_for(profile)
    return needed(remote, plan) if plan is not None else None
