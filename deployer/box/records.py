"""What the target says about a deployment: its runs, the current one, their records, states and outcomes.

The target is the source of truth, so status, history, logs and rollback work from any laptop with only the
deployment name and the host.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, cast

from deployer.engines import Engine

from deployer.engines import engine_for
from deployer.engines.base import KvAllocated, kv_allocated_in
from deployer.errors import NotFound
from deployer.logtext import clip_middle, clip_tail, readable
from deployer.host import probe_address
from deployer.box.push import Layout, RunDir
from deployer.remote.base import EndpointUnreachable, Remote
from deployer.box.process import status
from deployer.supervisor.protocol import OUTCOME_JSON, PROFILE_JSON, UP, Outcome, ProfileRecord, State
LINE_CHARS = 16 << 10     # one log line shown by `logs` (its head and end; the cut is noted)


@dataclass(frozen=True)
class RunView:
    """One run's records as the target keeps them (their formats: supervisor/protocol.py)."""

    run: RunDir
    record: ProfileRecord
    state: State
    outcome: Outcome | None

    @property
    def content_hash(self) -> str:
        return str(self.record.get("content_hash", ""))

    @property
    def alive(self) -> bool:
        return bool(self.state.get("alive")) or self.state.get("status") in UP and \
            bool(self.state.get("supervisor_alive"))

    @property
    def status(self) -> str:
        """The supervisor's status; a run an `up` stopped to replace it, and that nothing replaced (the `up` was
        killed), is `interrupted`: nobody asked for the deployment to stop (`stopped` is a `down`'s); while that stop
        runs it is `replacing` (never `stopping`, a `down`'s word)."""
        status = str(self.state.get("status", "unknown"))
        if self.state.get("stopped_for") == "replace" and status in ("stopped", "stopping"):
            return "interrupted" if status == "stopped" else "replacing"
        return status

    @property
    def reached_ready(self) -> bool:
        return bool(self.state.get("ready_at")) or (self.outcome or {}).get("outcome") == "ready"

    @property
    def crashlooped(self) -> bool:
        """It crash-looped after ready (restart.max restarts within restart.window_s): a version that does not stay
        up, whatever `down` made of its state since."""
        st = self.state
        return bool(st.get("crashloop_after_ready")) or "crashloop" in (st.get("status"), st.get("stopped_from"))

    @property
    def stayed_up(self) -> bool:
        """A good version: it reached ready and stayed up: ready for restart.stable_s with no crash (the
        supervisor's stable_at), or no crash since it was ready (a record of an earlier release, or one stopped
        within the window); never one that crash-looped.

        A node group's rank that its supervisor ended because a peer rank went away (the crash's `peer_lost`) is
        judged by that peer, not by this end: when `up` stops a group to replace it, every rank is asked at once,
        and a rank whose peer stopped a few seconds before its own stop arrived ends that way. The group's verdict
        takes every rank (deployments.nodes), so a peer that really crashed still makes the version not good."""
        if not self.reached_ready or self.crashlooped:
            return False
        crash = self.state.get("last_crash")
        peer_lost = isinstance(crash, dict) and bool(crash.get("peer_lost"))
        return bool(self.state.get("stable_at")) or not crash or peer_lost


def read_json(remote: Remote, path: str) -> dict[str, Any] | None:
    try:
        data = json.loads(remote.read(path, 0, 4 << 20) or b"null")
    except (NotFound, ValueError):
        return None
    return data if isinstance(data, dict) else None


def list_runs(remote: Remote, layout: Layout) -> list[str]:
    """Run ids, oldest first (ids start with a UTC timestamp)."""
    return remote.helper.listdir(layout.runs) or []


def current_run_id(remote: Remote, layout: Layout) -> str | None:
    link = remote.helper.readlink(layout.current)
    return posixpath.basename(link) if link else None


def run_view(remote: Remote, layout: Layout, run_id: str, *, live: bool = True) -> RunView:
    run = layout.run(run_id)
    record = read_json(remote, run.file(PROFILE_JSON)) or {}
    state = status(remote, run) if live else (read_json(remote, run.state) or {})
    return view_of(run, record, state, read_json(remote, run.file(OUTCOME_JSON)))


def view_of(run: RunDir, record: Mapping[str, Any], state: Mapping[str, Any],
            outcome: Mapping[str, Any] | None) -> RunView:
    """A RunView from the records' JSON as read from the target (the JSON edge: any release's records, each
    reader tolerating a missing key, as protocol.py's formats say)."""
    return RunView(run, cast(ProfileRecord, dict(record)), cast(State, dict(state)),
                   None if outcome is None else cast(Outcome, dict(outcome)))


def all_runs(remote: Remote, layout: Layout) -> tuple[list[RunView], str | None]:
    """Every run of the deployment (oldest first, records only) and the current run's id; NotFound if none."""
    run_ids = list_runs(remote, layout)
    if not run_ids:
        name, workdir = posixpath.basename(layout.root), posixpath.dirname(layout.root)
        raise NotFound(f"no deployment {name!r} under {workdir} on {remote.label}")
    return [run_view(remote, layout, r, live=False) for r in run_ids], current_run_id(remote, layout)


def current_view(remote: Remote, layout: Layout) -> RunView | None:
    run_id = current_run_id(remote, layout)
    return run_view(remote, layout, run_id) if run_id else None


ALLOCATION_WINDOW = 2 << 20   # bytes of an engine log's start read for its KV allocation line


def engine_allocated(remote: Remote, view: RunView, engine: Engine) -> KvAllocated | None:
    """What a run's engine said it allocated for its KV cache, from the start of its log (the supervisor's
    rotation keeps the startup part); None when its log says nothing of it or cannot be read."""
    if not engine.log.kv_allocated:
        return None
    try:
        head = remote.read(view.run.log, 0, ALLOCATION_WINDOW)
    except NotFound:
        return None
    return kv_allocated_in(engine.log.kv_allocated, readable(head.decode("utf-8", "replace")))


def tail_lines(remote: Remote, path: str, n: int, window: int | None = None) -> list[str]:
    """The last `n` readable lines of a remote log, reading one bounded window from its end.

    A line longer than the window (a hostile one, or a bar redrawn for an hour without newline) is shown by its
    end, saying how much came before it; every other line is capped at LINE_CHARS by its head and end (an
    engine's argument dump is read from its start, a progress line from its end).
    """
    size = remote.size(path) or 0
    window = min(size, window or tail_window(n))
    start = size - window
    return window_lines(remote.read(path, start, window), start, n)


def tail_window(n: int) -> int:
    """How many bytes from a log's end `tail_lines` reads for its last `n` lines."""
    return max(64 << 10, n * 400)


def window_lines(data: bytes, start: int, n: int) -> list[str]:
    """The last `n` readable lines of a log window that begins at byte `start` of the log (see tail_lines)."""
    chunk = data.decode("utf-8", "replace").split("\n")
    first_cut = start > 0
    if first_cut and len(chunk) > 1 and any(readable(line) for line in chunk[1:]):
        chunk, first_cut = chunk[1:], False  # the first line is cut and there is more to show
    lines: list[str] = []
    for i, raw in enumerate(chunk):
        text = readable(raw)
        if text:
            cut = first_cut and i == 0
            lines.append(clip_tail(text, LINE_CHARS, head_missing=True) if cut else clip_middle(text, LINE_CHARS))
    return lines[-n:]


def healthy(remote: Remote, port: int, path: str, timeout: float = 5.0, address: str = "127.0.0.1") -> bool:
    try:
        return remote.request("GET", port, path, timeout=timeout, address=address).status == 200
    except EndpointUnreachable:
        return False


def record_address(record: Mapping[str, Any]) -> str:
    """Where the target reaches a pushed attempt's server: the bind address its profile recorded, else loopback."""
    bind = ((record.get("profile") or {}).get("engine") or {}).get("host")
    return probe_address(bind) if isinstance(bind, str) else "127.0.0.1"


def record_engine(record: Mapping[str, Any]) -> Engine:
    """The engine of a pushed attempt (`record_kind`)."""
    return engine_for(record_kind(record))


def record_kind(record: Mapping[str, Any]) -> str:
    """The engine kind of a pushed attempt (profile.json); records written before `kind` existed hold a profile
    without engine.kind, which the profile model reads as its default engine (the only one then)."""
    kind = record.get("kind") or (record.get("profile") or {}).get("engine", {}).get("kind")
    if kind:
        return str(kind)
    from deployer.profile.model import DEFAULT_ENGINE_KIND  # only for an old record: the model's import is slow

    return DEFAULT_ENGINE_KIND
