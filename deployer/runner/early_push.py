"""Early push: attempt 1's run dir, rendered from the profile as written, goes to the target while preflight runs.

Preflight's engine probe imports the engine on the target (with torch: 5-10 s on a GPU box whenever its answer is
not cached there yet: a first `up`, an engine upgrade), and most of the time it hands the profile back unchanged.
So `up` pushes the run dir on a thread of its own while preflight runs on the calling thread. When preflight is done,
`claim` gives the early run dir to attempt 1 if that attempt would push exactly the same files (same content hash,
same record, same supervisor config); otherwise (preflight translated or healed something) the early run dir is
removed and the healed bundle is pushed as before. Whatever ends the `up` before a claim (preflight refuses, the port
is taken, the version is already running, a DeployError, Ctrl-C) removes it too, so a refused `up` leaves the target
as it found it: `current`, the serving version and the other run dirs are never touched by the early push.

Only the calling thread emits events: the push thread is silent and hands back its RunDir or the error it met, so
the events keep their order and the sinks (console, NDJSON), which are not thread-safe, need no lock. A failed
early push is never reported itself: attempt 1 then pushes as before and meets (and reports) the same error, or
preflight's refusal is the error the user sees.

What the two threads share is safe for it: the Conversation matches replies to requests by id (requests run
concurrently in the helper), SSHRemote serializes its one SFTP session, and the lock's Guarded wrapper only reads
the lease's state.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from deployer.errors import DeployError
from deployer.profile.model import Profile
from deployer.box.push import Layout, RunDir, new_run_id, profile_record, push, supervisor_config
from deployer.remote.base import Remote
from deployer.render.bundle import Bundle, render
from deployer.supervisor.protocol import ProfileRecord, SuperviseConfig

JOIN_S = 120.0   # the push's own steps time out well within this (SFTP 30 s per call, the hash check 60 s)


@dataclass(frozen=True)
class Planned:
    """What attempt 1 pushes for a profile: its bundle, its record (profile.json) and its supervisor config."""

    bundle: Bundle
    record: ProfileRecord
    config: SuperviseConfig

    @classmethod
    def of(cls, profile: Profile, *, up_id: str, written_hash: str | None, bundle: Bundle | None = None) -> Planned:
        bundle = bundle or render(profile)
        record = profile_record(profile, bundle, attempt=1, up_id=up_id, written_hash=written_hash)
        return cls(bundle, record, supervisor_config(profile))

    def same_files(self, other: Planned) -> bool:
        """Would push the same files (the push time aside): launch.sh and env by the content hash, the rest as is."""
        return self.bundle.content_hash == other.bundle.content_hash and self.config == other.config and \
            _timeless(self.record) == _timeless(other.record)


def _timeless(record: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != "pushed_at"}


class EarlyPush:
    """One push of a planned run dir on a thread of its own; claimed by attempt 1 or removed."""

    def __init__(self, remote: Remote, layout: Layout, plan: Planned) -> None:
        self.remote = remote
        self.layout = layout
        self.plan = plan
        self.run = layout.run(new_run_id(plan.bundle, 1))
        self.claimed = False
        self._pushed: RunDir | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._push, name="deployer-early-push", daemon=True)

    def start(self) -> EarlyPush:
        self._thread.start()
        return self

    def _push(self) -> None:
        try:
            self._pushed = push(self.remote, self.layout, self.plan.bundle, self.plan.record, self.plan.config,
                                self.run.run_id)
        except BaseException as exc:  # handed to the calling thread (which drops it: attempt 1 pushes again)
            self._error = exc

    def _wait(self) -> bool:
        """Wait for the push to end; True when it completed (every file on the target, verified)."""
        self._thread.join(JOIN_S)
        return not self._thread.is_alive() and self._pushed is not None

    def claim(self, plan: Planned) -> RunDir | None:
        """The early run dir when `plan` would push the same files (it is then attempt 1's); else it is removed and
        None (attempt 1 pushes `plan` itself)."""
        if self._wait() and self.plan.same_files(plan):
            self.claimed = True
            return self._pushed
        self.discard()
        return None

    def discard(self) -> None:
        """Remove the early run dir (best effort: a lost lock or connection is the error already in flight)."""
        if self.claimed:
            return
        self._wait()
        self.claimed = True  # once
        try:  # also after a failed push: it removes what it wrote, unless the connection broke under it
            self.remote.helper.remove([self.run.path], self.layout.root)
        except DeployError:
            pass


@contextmanager
def early_push(remote: Remote, layout: Layout, plan: Planned | None) -> Iterator[EarlyPush | None]:
    """Start pushing `plan` (None: no early push) for the block; unless the block claims it, it is removed on the
    way out, whatever ends the block (an error, Ctrl-C, a return)."""
    early = EarlyPush(remote, layout, plan).start() if plan is not None else None
    try:
        yield early
    finally:
        if early is not None:
            early.discard()
