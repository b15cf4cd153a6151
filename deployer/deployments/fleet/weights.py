"""A serving fleet's weights before its rolling replace (issue 25): every host fetches the new revision (or is
pushed the new directory, `engine.weights.push`) at once, while every replica still serves; the roll's per-replica
`up` then finds the files there (its own step only lists and checks them). A host whose fetch or push fails here is
left to its replica's own `up`, which says why."""

from __future__ import annotations

from deployer.errors import DeployError
from deployer.deployments.fleet.links import Links
from deployer.deployments.fleet.members import Fleet, ReplicaMember
from deployer.runner.fanout import TaggedSink, at_once
from deployer.runner.weights import fetch_weights


def fetch_first(fleet: Fleet, links: Links, sink: TaggedSink) -> None:
    """The weights of every replica's profile fetched or pushed on its host, once per host, all hosts at once."""
    firsts: dict[str, ReplicaMember] = {}
    for member in fleet.replicas:
        firsts.setdefault(member.host, member)

    def one(member: ReplicaMember) -> None:
        if member.profile.engine.weights is None:
            return
        try:
            fetch_weights([links.to(member.profile.target)], member.profile,
                          sink.tagged(member.host, f"r{member.index}"))
        except DeployError:
            pass  # the replica's own `up` meets it again and says it in its result

    at_once(one, list(firsts.values()))
