"""`connect(spec)`: the one place that picks the Remote for a target (LocalRemote for `host: local`, else SSH);
`conversing(spec)`: that connection with its target-side helper, as commands use it; `kept_open()`: within it,
`conversing` keeps one connection and helper per target open across calls (`deploy top`'s refreshes);
`started_early(spec)`: that connection and its helper started at once, taken by the first `conversing(spec)` within
it (`deploy status` connects first, and imports the modules that make its report while the target's shell starts);
`target_spec(profile)`: a single-host profile's target as the seam takes it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from deployer.errors import ProfileError, RemoteError
from deployer.host import LOCAL, TargetSpec
from deployer.remote.base import Remote, Transport
from deployer.remote.conversation import Conversation
from deployer.remote.local import LocalRemote
from deployer.remote.ssh.config import resolve
from deployer.remote.ssh.connection import SSHRemote

if TYPE_CHECKING:
    from deployer.profile.model import Profile, Target


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


class _Early:
    """The connection and helper `started_early` started: the first `conversing` of their target takes them (or
    the error their start raised); `close` closes them when nobody did."""

    def __init__(self, spec: TargetSpec) -> None:
        self.spec = spec
        self.started: tuple[Transport, Conversation] | None = None
        self.error: Exception | None = None
        self._lock = threading.Lock()
        self._taken = False
        try:
            remote = connect(spec)
            try:  # the exec goes out now: the target's login shell and the helper start while the caller works
                self.started = (remote, Conversation.open(remote, wait=False))
            except BaseException:
                remote.close()
                raise
        except Exception as e:  # raised where the connection is asked for, as a connect there would have
            self.error = e

    def _claim(self) -> bool:
        with self._lock:
            first, self._taken = not self._taken, True
            return first

    def take(self, spec: TargetSpec) -> tuple[Transport, Conversation] | None:
        """The connection and helper, when they are `spec`'s and nobody took them yet."""
        if spec != self.spec or not self._claim():
            return None
        if self.error is not None:
            raise self.error
        return self.started

    def close(self) -> None:
        if self._claim() and self.started is not None:
            _close(*self.started)


_early: _Early | None = None


@contextmanager
def started_early(spec: TargetSpec | None) -> Iterator[None]:
    """Connect to `spec` and start its helper now, before the caller's slower work (None: start nothing): the
    helper's exec goes out at once, so the target's login shell and the helper's start-up run while the caller
    imports what makes and shows its answer, instead of after. The first `conversing(spec)` within takes them
    (raising the error the connect raised, if it did); whatever was not taken is closed on exit."""
    global _early
    if spec is None:
        yield
        return
    with _kept_lock:
        if _early is not None or _kept is not None:
            raise RuntimeError("started_early() is not reentrant, nor for use inside kept_open()")
    early = _Early(spec)
    with _kept_lock:
        _early = early
    try:
        yield
    finally:
        with _kept_lock:
            _early = None
        early.close()


def _take_early(spec: TargetSpec) -> tuple[Transport, Conversation] | None:
    early = _early
    return None if early is None else early.take(spec)


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
    started = _take_early(spec) if connection is None else None
    remote: Transport = connection if connection is not None else started[0] if started else connect(spec)
    conv: Conversation | None = started[1] if started else None
    try:
        if conv is None:
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
    return spec_of(profile.target, trust_new_host)


def spec_of(target: Target, trust_new_host: bool = False) -> TargetSpec:
    """How to reach the host a profile's `target:` section (or a fleet member's) names."""
    return TargetSpec(host=target.host, user=target.user, port=target.port, identity_file=target.identity_file,
                      known_hosts=target.known_hosts, trust_new_host=trust_new_host)


def ssh_address(target: Target) -> str:
    """The address a host is reached at: `HostName` of its ssh_config entry (an alias), else the host as written."""
    if target.host == LOCAL:
        return "127.0.0.1"
    return resolve(spec_of(target)).hostname
