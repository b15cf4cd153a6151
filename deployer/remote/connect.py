"""`connect(spec)`: the one place that picks the Remote for a target (LocalRemote for `host: local`, else SSH);
`conversing(spec)`: that connection with its target-side helper, as commands use it; `kept_open()`: within it,
`conversing` keeps one connection and helper per target open across calls (`deploy top`'s refreshes);
`target_spec(profile)`: a single-host profile's target as the seam takes it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from deployer.errors import ProfileError, RemoteError
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


class _Kept:
    """The connections `kept_open` holds: one (transport, conversation) per target, made on first use."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.making: dict[TargetSpec, threading.Lock] = {}
        self.open: dict[TargetSpec, tuple[Transport, Conversation]] = {}

    def get(self, spec: TargetSpec) -> Conversation:
        with self.lock:
            making = self.making.setdefault(spec, threading.Lock())
        with making:  # one connect per target, several targets connecting at once
            with self.lock:
                found = self.open.get(spec)
            if found is not None:
                return found[1]
            remote = connect(spec)
            conv = Conversation.open(remote, wait=False)
            with self.lock:
                self.open[spec] = (remote, conv)
            return conv

    def drop(self, spec: TargetSpec) -> None:
        with self.lock:
            found = self.open.pop(spec, None)
        if found is not None:
            _close(*found)

    def close(self) -> None:
        with self.lock:
            kept, self.open = list(self.open.values()), {}
        for remote, conv in kept:
            _close(remote, conv)


def _close(remote: Transport, conv: Conversation) -> None:
    conv.close()
    remote.close()


_kept: _Kept | None = None
_kept_lock = threading.Lock()


@contextmanager
def kept_open() -> Iterator[None]:
    """Within it, `conversing(spec)` reuses one connection and helper per target (the fan-out's threads too),
    all closed on exit; a connection that broke under a call is dropped (the next call connects again)."""
    global _kept
    with _kept_lock:
        if _kept is not None:
            raise RuntimeError("kept_open() is not reentrant")
        _kept = _Kept()
    try:
        yield
    finally:
        with _kept_lock:
            kept, _kept = _kept, None
        kept.close()


@contextmanager
def conversing(spec: TargetSpec, connection: Transport | None = None) -> Iterator[Conversation]:
    """A connection (`connection`, left open: a fleet's one per host; else a new one, closed on exit) and its one
    exec channel, the target-side helper (every command a request to it), closed on exit; inside `kept_open`,
    the target's kept connection and helper, left open."""
    kept = _kept
    if connection is None and kept is not None:
        try:
            yield kept.get(spec)
        except RemoteError:
            kept.drop(spec)
            raise
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
