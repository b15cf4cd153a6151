"""The weights step of `up` (and of `deploy prepare`): before the launch is rendered and before anything is stopped,
the hub repo `engine.weights` names is fetched (deployer/box/weights.py), or with `engine.weights.push` the
directory on the controller is pushed (deployer/box/pushweights.py), on every host of the run, once per host
and at once on all of them; the profile comes back pinned to what it loads (the commit fetched: deployer/prepare/
weights.py; the pushed copy: deployer/prepare/pushed.py).

Called by runner/up.py (one host; a fleet's members each through it, and two members on one host share one fetch
or push: the target-side lock) and by deployments/nodes/up.py (every node), always before the attempt runner stops what served.
`prepare_weights` and `plan_weights` are the hooks for `deploy prepare` (fetch or push, no launch) and `deploy plan`
(what it would take: size, missing bytes, free disk).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from deployer.errors import TargetError
from deployer.events import EventSink, Info
from deployer.local.history import home
from deployer.prepare.pushed import Pushed, WeightsDone, WeightsNeeded, pinned_push, plan_push
from deployer.prepare.weights import pinned, plan_for
from deployer.profile.model import Profile
from deployer.remote.base import Remote
from deployer.box.push import expand_workdir
from deployer.box.pushweights import needed_push, push
from deployer.box.weights import fetch, needed

Each = Callable[[Callable[[int], WeightsDone], list[int]], list[WeightsDone]]
_T = TypeVar("_T")


def fetch_weights(remotes: Sequence[Remote], profile: Profile, emit: EventSink, each: Each | None = None,
                  sink: Callable[[EventSink, int], EventSink] | None = None,
                  workdirs: Sequence[str] | None = None) -> tuple[Profile, list[WeightsDone]]:
    """`profile` pinned to the weights fetched or pushed on every host of `remotes` (once per host label, at once
    through `each`; `sink`: where the events of the i-th remote go; `workdirs`: the i-th remote's target.workdir,
    where a push goes, default the profile's); unchanged, with nothing done, when the profile has no
    `engine.weights` (or is a run's record of a push: its copy is checked to be there)."""
    pushing = plan_push(profile, push_cache(), lambda line: emit(Info(message=line)))
    plan = plan_for(profile)
    if pushing is None and plan is None:
        _still_there(remotes, profile)
        return profile, []
    firsts: dict[str, int] = {}
    for index, remote in enumerate(remotes):
        firsts.setdefault(remote.label, index)

    def one(index: int) -> WeightsDone:
        to = sink(emit, index) if sink is not None else emit
        if pushing is not None:
            workdir = workdirs[index] if workdirs is not None else profile.target.workdir
            return push(remotes[index], pushing, expand_workdir(remotes[index], workdir), to)
        assert plan is not None
        return fetch(remotes[index], plan, to)

    done = (each or _serial)(one, list(firsts.values()))
    loads = {d.commit for d in done}
    if len(loads) != 1:  # a branch that moved between two hosts' listings, or a push to different paths
        what = pushing.describe() if pushing is not None else plan.describe() if plan is not None else ""
        raise TargetError(f"{what} is at different places on the hosts ({', '.join(sorted(loads))})",
                          hint="give every node the same workdir (the engine's model path is one for the group)"
                          if pushing is not None else "set engine.weights.revision to a commit")
    for index, item in zip(firsts.values(), done):
        (sink(emit, index) if sink is not None else emit)(Info(message=item.describe()))
    if isinstance(done[0], Pushed):
        return pinned_push(profile, done[0].folder, done[0].content), done
    return pinned(profile, done[0].commit), done


def push_cache() -> Path:
    """Where the sha256 of pushed files is kept on the controller (prepare/pushed.py's HashCache)."""
    return home() / "cache"


def _still_there(remotes: Sequence[Remote], profile: Profile) -> None:
    """A run's record of a push (restart, rollback, a node group's rollback): its copy must still be on every host;
    one line when it is gone (nothing else has stopped yet)."""
    weights = profile.engine.weights
    if weights is None or weights.pushed is None:
        return
    for remote in remotes:
        if remote.helper.listdir(profile.engine.model_path) is None:
            raise TargetError(f"the weights pushed as {weights.pushed[:12]} are no longer on {remote.label} "
                              f"({profile.engine.model_path})", hint="run `deploy up` with the profile file to push "
                                                                     "them again")


def _serial(work: Callable[[int], _T], items: list[int]) -> list[_T]:
    return [work(item) for item in items]


def prepare_weights(remote: Remote, profile: Profile, emit: EventSink) -> WeightsDone | None:
    """The hook for `deploy prepare`: fetch or push the profile's weights on its host without launching anything."""
    _, done = fetch_weights([remote], profile, emit)
    return done[0] if done else None


def plan_weights(remote: Remote, profile: Profile) -> WeightsNeeded | None:
    """The hook for `deploy plan`: what the fetch or push would take on the profile's host (size, missing bytes,
    free disk), nothing done; None without `engine.weights`."""
    pushing = plan_push(profile, push_cache())
    if pushing is not None:
        return needed_push(remote, pushing, expand_workdir(remote, profile.target.workdir))
    plan = plan_for(profile)
    return needed(remote, plan) if plan is not None else None
