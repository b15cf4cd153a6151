"""One SSH connection per host for a whole fleet command.

A fleet `up` asks each host several things: whether its replicas serve (the survey), then each member's `up`, and
on the router's host the router's session. Each used to dial on its own (a handshake is ~6 round trips: 0.3 s at
50 ms); `Links` dials a host the first time a step needs it and hands the same connection to every later step on
that host (each step still opens its own helper conversation on it), and closes them all at the end. A host that
cannot be reached fails the step that asked (a DeployError, reported with that member), and is tried again by the
next step that asks.
"""

from __future__ import annotations

import threading

from deployer.remote.connect import spec_of
from deployer.profile.model import Target
from deployer.remote.base import Remote
from deployer.host import TargetSpec
from deployer.remote.connect import connect


class Links:
    """Open connections by target; thread-safe (the fan-out works on several hosts at once)."""

    def __init__(self, trust_new_host: bool = False) -> None:
        self.trust_new_host = trust_new_host
        self._open: dict[TargetSpec, Remote] = {}
        self._dialing: dict[TargetSpec, threading.Lock] = {}
        self._lock = threading.Lock()
        self._closed = False

    def to(self, target: Target) -> Remote:
        """The connection to `target`'s host, dialed now if no step has needed it yet."""
        spec = spec_of(target, self.trust_new_host)
        with self._lock:
            dialing = self._dialing.setdefault(spec, threading.Lock())
        with dialing:  # one dial per host, even when two steps ask at once
            with self._lock:
                found = self._open.get(spec)
            if found is not None:
                return found
            remote = connect(spec)
            with self._lock:
                if self._closed:
                    remote.close()
                    raise RuntimeError("the fleet command's connections were closed")
                self._open[spec] = remote
            return remote

    def close(self) -> None:
        with self._lock:
            self._closed = True
            remotes, self._open = list(self._open.values()), {}
        for remote in remotes:
            remote.close()

    def __enter__(self) -> Links:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
