"""One round trip for the on-call read commands: the target's snapshot of a deployment, read as RunViews.

`status`, `logs`, `history` need the run list, the current run, records, the live state, an env file (to mask
what they show) and a log window. Asking each of those separately costs an exec channel or an SFTP session
apiece, and every one runs the user's login shell (~150 ms with conda in .bashrc). Here they come from the
supervisor's read-only `snapshot` (deployer/supervisor/snapshot.py) in one request: to the command's
target-side helper when the remote is a Conversation (the on-call commands open one: their only exec channel),
else (a bare connection's `helper`, remote/oneshot.py) one exec whose program is sent over stdin from this
deployer's own copy, so a target whose run dirs are damaged or whose payload is older still answers.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
from dataclasses import dataclass
from typing import Any

from deployer.errors import TargetError
from deployer.box.push import Layout
from deployer.remote.base import Remote
from deployer.logtext import readable
from deployer.box.records import RunView, view_of

TIMEOUT_S = 60.0

@dataclass(frozen=True)
class LogLine:
    """One line of a log as the target sent it: whole (`cut` 0, all in `head`), or its head and its end with the
    exact number of bytes left out between them."""

    head: bytes
    cut: int = 0
    tail: bytes = b""


@dataclass(frozen=True)
class LogWindow:
    """The end of one run's engine.log: `data` is the file's bytes from `start` to `size` (at snapshot time);
    asked for by lines, `lines` are its last lines from `start` on (`first_partial`: the first began earlier)."""

    run_id: str
    size: int
    start: int
    data: bytes
    lines: list[LogLine] | None = None
    first_partial: bool = False


@dataclass(frozen=True)
class Attempt:
    """What the diagnosis reads of one run's last engine life: its log windows joined (the first traceback and
    the tail, as pipeline.up.attempt_log reads them) and, for a death by signal, the kernel log's tail."""

    run_id: str
    text: str
    dmesg: str | None


@dataclass(frozen=True)
class Snapshot:
    """One deployment as its target saw it in one instant."""

    layout: Layout
    runs: list[str]                      # oldest first
    current: str | None
    records: dict[str, dict[str, Any]]   # run id -> {"profile", "state", "outcome", "unreadable"} (runs asked for)
    live: dict[str, Any] | None          # the current run's status (state.json plus liveness)
    env: dict[str, str | None]           # env file text of the current run and the run whose log is shown
    log: LogWindow | None
    attempt: Attempt | None = None
    lock: str | None = None              # the lock file's text (a lease record), None when there is none
    lock_events: str = ""                # the tail of the lock's events (JSON lines, the first maybe cut)

    @property
    def name(self) -> str:
        return posixpath.basename(self.layout.root)

    @property
    def workdir(self) -> str:
        return posixpath.dirname(self.layout.root)

    def view(self, run_id: str, *, live: bool = False) -> RunView:
        """The run's records, as records.run_view reads them; `live` gives the current run its live status."""
        rec = self.records.get(run_id) or {}
        state = (self.live or {}) if live and run_id == self.current else rec.get("state") or {}
        return view_of(self.layout.run(run_id), rec.get("profile") or {}, state, rec.get("outcome"))

    def current_view(self) -> RunView | None:
        return self.view(self.current, live=True) if self.current else None


def take(remote: Remote, root: str, *, runs: int | None = 0, log_tail: int | None = None,
         previous: bool = False, attempt: str = "current", log_lines: int | None = None) -> Snapshot:
    """Snapshot of the deployment dir `root` (`~` is the target user's home): records of the newest `runs` runs
    (None: all) and the current one; with `log_tail`, the last that many bytes of the log `logs` shows, with
    `log_lines` its last that many lines; `attempt` "current": the diagnosis windows of a crashed current run,
    "failed": of the newest failed run."""
    args = [root, "--runs", "all" if runs is None else str(runs), "--attempt", attempt]
    if log_lines is not None:
        args += ["--log-lines", str(log_lines)] + (["--previous"] if previous else [])
    elif log_tail is not None:
        args += ["--log-tail", str(log_tail)] + (["--previous"] if previous else [])
    return _parse(_ask(remote, args, root))


def take_workdir(remote: Remote, workdir: str) -> tuple[str, dict[str, Snapshot]]:
    """Every deployment under `workdir` (its current run only) and the workdir as the target spells it."""
    data = _ask(remote, [workdir, "--workdir"], workdir)
    deployments = data.get("deployments")
    if not isinstance(deployments, dict):
        raise TargetError(f"unexpected snapshot of {workdir} from {remote.label}")
    return str(data.get("workdir") or workdir), {str(n): _parse(d) for n, d in sorted(deployments.items())}


def _ask(remote: Remote, args: list[str], what: str) -> dict[str, Any]:
    """One request to the command's helper (a bare connection: one exec of this deployer's own program)."""
    return remote.helper.snapshot(args, TIMEOUT_S)


def _parse(data: dict[str, Any]) -> Snapshot:
    if not isinstance(data.get("root"), str):
        raise TargetError("unexpected snapshot from the target: no deployment dir in it")
    records = {str(k): v for k, v in (data.get("records") or {}).items() if isinstance(v, dict)}
    env = {str(k): v if isinstance(v, str) else None for k, v in (data.get("env") or {}).items()}
    live, lock = data.get("status"), data.get("lock")
    return Snapshot(Layout(str(data["root"])), [str(r) for r in data.get("runs") or []],
                    str(data["current"]) if data.get("current") else None, records,
                    live if isinstance(live, dict) else None, env, _log(data.get("log")), _attempt(data.get("attempt")),
                    lock if isinstance(lock, str) else None, str(data.get("lock_events") or ""))


def _attempt(data: Any) -> Attempt | None:
    if not isinstance(data, dict) or not data.get("run"):
        return None
    parts = [_b64(w.get("data")) for w in data.get("windows") or [] if isinstance(w, dict)]
    dmesg = data.get("dmesg")
    return Attempt(str(data["run"]), b"\n".join(parts).decode("utf-8", "replace"),
                   dmesg if isinstance(dmesg, str) else None)


def _b64(text: Any) -> bytes:
    try:
        return base64.b64decode(str(text or ""), validate=True)
    except (binascii.Error, ValueError):
        return b""


def _log(data: Any) -> LogWindow | None:
    if not isinstance(data, dict) or not data.get("run"):
        return None
    lines = data.get("lines")
    return LogWindow(str(data["run"]), int(data.get("size") or 0), int(data.get("start") or 0), _b64(data.get("data")),
                     [_line(x) for x in lines] if isinstance(lines, list) else None, bool(data.get("first_partial")))


def shown_lines(lines: list[LogLine], first_partial: bool = False, start: int = 0) -> list[str]:
    """Log lines as the target sent them (snapshot `--log-lines`), readable: a long one by its head and its end
    with the bytes cut between them; `first_partial`: the first began before byte `start`, which was not read."""
    shown: list[str] = []
    for i, line in enumerate(lines):
        head = readable(line.head.decode("utf-8", "replace"))
        text = head if not line.cut else \
            f"{head} ... [{line.cut} bytes cut] ... {readable(line.tail.decode('utf-8', 'replace'))}"
        if i == 0 and first_partial:
            text = f"[start of line not read: it began before byte {start}] ... {text}"
        if text:
            shown.append(text)
    return shown


def _line(item: Any) -> LogLine:
    if not isinstance(item, list) or len(item) != 3 or not isinstance(item[1], int):
        raise TargetError("unexpected log line in the target's snapshot")
    return LogLine(_b64(item[0]), item[1], _b64(item[2]))
