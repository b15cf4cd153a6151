"""Running the target-side fetch (deployer/supervisor/fetch.py) on one host and reading its lines.

The helper runs it (its `fetch` op: a program of its own, protocol.Op.program), its request (with the
token) goes to the program's stdin; its JSON lines become
progress events, its last line the commit fetched or one line of error: a disk that cannot hold what is missing
(DiskFull), a file that does not match the listing (TransferFailed), a hub that refuses or cannot be reached
(TargetError).
"""

from __future__ import annotations

import json
import time
from typing import Any

from deployer.errors import DiskFull, RemoteError, TargetError, TransferFailed
from deployer.events import EventSink, Info, PhaseEntered, Progressed
from deployer.prepare.weights import PHASE, Fetched, Needed, WeightsPlan, progress
from deployer.remote.base import Remote, Session

QUIET_S = 600.0    # no line for this long (the program says progress every second while bytes move): given up


def needed(remote: Remote, plan: WeightsPlan, *, wait_s: float = 120.0) -> Needed:
    """What fetching `plan` would take on this host (`deploy plan`): the listing and the free disk, nothing fetched."""
    session = _start(remote)
    try:
        session.send(plan.request(dry=True))
        while True:
            line = next_line(session, f"fetching {plan.describe()} on {remote.label}", wait_s)
            if "listed" in line:
                return Needed(remote.label, str(line["listed"]), int(line.get("total") or 0),
                              int(line.get("missing") or 0), int(line.get("free") or 0))
            if "error" in line:
                raise _error(plan, remote.label, str(line["error"]), str(line.get("message") or ""))
    finally:
        session.close()


def _start(remote: Remote) -> Session:
    return remote.helper.program("fetch")


def next_line(session: Session, what: str, wait_s: float) -> dict[str, Any]:
    """The next JSON line of a target-side program (others skipped); TargetError, starting with `what`, when none
    comes or it ended."""
    while True:
        try:
            text = session.readline(wait_s)
        except RemoteError as exc:
            raise TargetError(f"{what}: {exc}") from None
        if text is None:
            raise TargetError(f"{what}: it ended without a result")
        line = _json(text)
        if line is not None:
            return line


def fetch(remote: Remote, plan: WeightsPlan, emit: EventSink, *, progress_s: float = 1.0,
          quiet_s: float = QUIET_S) -> Fetched:
    """Fetch `plan` into the target's hub cache; the commit and bytes, or one line of error."""
    began = time.monotonic()
    emit(PhaseEntered(phase=PHASE, elapsed=0.0, line=f"{plan.describe()} on {remote.label}"))
    session = _start(remote)
    try:
        session.send(plan.request(progress_s))
        while True:
            line = next_line(session, f"fetching {plan.describe()} on {remote.label}", quiet_s)
            if "done" in line:
                return Fetched(remote.label, str(line["done"]), int(line.get("fetched") or 0),
                               int(line.get("total") or 0), int(line.get("files") or 0),
                               time.monotonic() - began, str(line.get("snapshot") or ""))
            if "error" in line:
                raise _error(plan, remote.label, str(line["error"]), str(line.get("message") or ""))
            _say(line, emit, time.monotonic() - began)
    finally:
        session.close()


def _json(text: str) -> dict[str, Any] | None:
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _say(line: dict[str, Any], emit: EventSink, elapsed: float) -> None:
    download = progress(line)
    if download is not None:
        emit(Progressed(phase=PHASE, elapsed=round(elapsed, 2), line=download.text, download=download))
    elif "waiting" in line:
        emit(Info(message=f"waiting for {line['waiting']}"))


def _error(plan: WeightsPlan, host: str, kind: str, message: str) -> Exception:
    what = f"fetching {plan.describe()} on {host}"
    if kind == "disk":
        return DiskFull(f"{what}: {message}", hint="free space there, or point HF_HOME at a larger disk "
                                                   "(nothing was stopped)")
    if kind in ("size", "sha256"):
        return TransferFailed(f"{what}: {message}", host=None)
    return TargetError(f"{what}: {message}")
