"""`connect(spec)`: the one place that picks the Remote for a target (LocalRemote for `host: local`, else SSH);
`conversing(spec)`: that connection with its target-side helper, as commands use it (the pool's connection inside
`remote.pool.kept_open`); `target_spec(profile)`: a
single-host profile's target as the seam takes it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from deployer.errors import ProfileError
from deployer.remote import pool
from deployer.remote.base import LOCAL, Remote, TargetSpec, Transport
from deployer.remote.conversation import Conversation
from deployer.remote.local import LocalRemote
from deployer.remote.ssh.connection import SSHRemote

if TYPE_CHECKING:
    from deployer.profile.model import Profile


def connect(spec: TargetSpec) -> Remote:
    """`host: local` -> LocalRemote; anything else -> SSHRemote, connected now (errors surface here)."""
    if spec.host == LOCAL:
        return LocalRemote()
    remote = SSHRemote(spec)
    remote.open()
    return remote


@contextmanager
def conversing(spec: TargetSpec, connection: Transport | None = None) -> Iterator[Conversation]:
    """A connection (`connection`, left open: a fleet's one per host; else a new one, closed on exit) and its one
    exec channel, the target-side helper (every command a request to it), closed on exit."""
    shared = pool.active() if connection is None else None
    if shared is not None:
        with shared.use(spec) as kept, conversing(spec, kept) as pooled:
            yield pooled
        return
    remote: Transport = connection if connection is not None else connect(spec)
    conv: Conversation | None = None
    try:
        conv = Conversation.open(remote, wait=False)  # the first request goes out with the exec
        yield conv
    finally:
        if conv is not None:
            conv.close()
        if connection is None:
            remote.close()


def target_spec(profile: Profile, trust_new_host: bool = False) -> TargetSpec:
    """How to reach a single-host profile's target; a fleet profile is refused in one line."""
    if profile.is_fleet:  # every command that reaches a host comes through here
        raise ProfileError("replicas/nodes/router: this command works on one host; a fleet profile goes to up, status, "
                           "logs, down, restart, smoke (or name one member, <name>-r<N>, with --host)",
                           file=str(profile.source or "<profile>"))
    t = profile.target
    return TargetSpec(host=t.host, user=t.user, port=t.port, identity_file=t.identity_file,
                      known_hosts=t.known_hosts, trust_new_host=trust_new_host)
