"""A serving fleet's weights before its rolling replace (issue 25): every host fetches the new revision at once,
while every replica still serves; the roll's per-replica `up` then finds the files on disk (its own fetch only
lists and checks them). A host whose fetch fails here is left to its replica's own `up`, which says why."""

from __future__ import annotations

from deployer.errors import DeployError
from deployer.events import Info
from deployer.fleet.links import Links
from deployer.fleet.members import Fleet, ReplicaMember
from deployer.prepare.weights import plan_for
from deployer.runner.fanout import TaggedSink, at_once
from deployer.target.weights import fetch


def fetch_first(fleet: Fleet, links: Links, sink: TaggedSink) -> None:
    """The weights of every replica's profile fetched on its host, once per host, all hosts at once."""
    firsts: dict[str, ReplicaMember] = {}
    for member in fleet.replicas:
        firsts.setdefault(member.host, member)

    def one(member: ReplicaMember) -> None:
        plan = plan_for(member.profile)
        if plan is None:
            return
        emit = sink.tagged(member.host, f"r{member.index}")
        try:
            emit(Info(message=fetch(links.to(member.profile.target), plan, emit).describe()))
        except DeployError:
            pass  # the replica's own `up` meets it again and says it in its result

    at_once(one, list(firsts.values()))
