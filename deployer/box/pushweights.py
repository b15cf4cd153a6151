"""Pushing a model directory to one host (`engine.weights.push`): the target-side receiver
(deployer/supervisor/push.py) says what is there already, the missing bytes go over the transport's bulk
put as chunk files (SFTP, or inside the helper conversation when small; each checked by its sha256 on arrival),
the receiver appends each to its staged file, checks every file whole against its sha256 and renames them into
place, so a push either completes or leaves staged files the next one continues from.

A staged file that does not check out (a damaged partial file, a changed one) is sent again from its start, once;
a file in the pushed directory that no longer matches (changed on the target) is said and sent again.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from deployer.errors import DiskFull, TargetError, TransferFailed
from deployer.events import Download, EventSink, Info, PhaseEntered, Progressed, Warn
from deployer.prepare.pushed import LocalFile, PushNeeded, Pushed, PushPlan, models_dir
from deployer.prepare.weights import size_text
from deployer.remote.base import Remote, Session
from deployer.remote.oneshot import UNSAFE_HINT
from deployer.box.weights import next_line

PHASE = "pushing weights"
BATCH = 32 << 20      # bytes per bulk put (and the most read into memory at once)
WAIT_S = 600.0        # for one answer of the receiver (a large file's sha256 on a slow disk)


@dataclass(frozen=True)
class Piece:
    """A part of one file to send: `size` bytes from `offset`."""

    index: int
    file: LocalFile
    offset: int
    size: int

    @property
    def last(self) -> bool:
        return self.offset + self.size == self.file.size

    def read(self) -> bytes:
        with open(self.file.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read(self.size)
        if len(data) != self.size:
            raise TransferFailed(f"{self.file.path} changed while it was pushed (it is shorter now); run again",
                                 host=None)
        return data


class Receiver:
    """One conversation with the receiver on one host."""

    def __init__(self, remote: Remote, plan: PushPlan, workdir: str) -> None:
        self.remote, self.plan, self.workdir = remote, plan, workdir
        self.what = f"pushing {plan.describe()} to {remote.label}"
        self.chunks = posixpath.join(models_dir(workdir), ".chunks-" + plan.content)
        self.session: Session = remote.helper.program("push")   # the helper runs the receiver as its child

    def ask(self, data: dict[str, Any] | bytes, emit: EventSink | None = None) -> dict[str, Any]:
        self.session.send(data if isinstance(data, bytes) else (json.dumps(data) + "\n").encode())
        while True:
            line = next_line(self.session, self.what, WAIT_S)
            if "error" in line:
                raise self.error(str(line["error"]), str(line.get("message") or ""))
            if "waiting" in line:
                if emit is not None:
                    emit(Info(message=f"waiting for {line['waiting']}"))
                continue
            return line

    def error(self, kind: str, message: str) -> Exception:
        if kind == "disk":
            return DiskFull(f"{self.what}: {message}", hint="free space there or set target.workdir to a larger "
                                                            "disk (nothing was stopped)")
        if kind == "unsafe":
            return TargetError(f"{self.what}: {message}", hint=UNSAFE_HINT)
        return TargetError(f"{self.what}: {message}")

    def close(self) -> None:
        self.session.close()


def needed_push(remote: Remote, plan: PushPlan, workdir: str) -> PushNeeded:
    """What pushing `plan` would take on this host (`deploy plan`): bytes to send, the free disk; nothing sent."""
    receiver = Receiver(remote, plan, workdir)
    try:
        have = receiver.ask(plan.request(workdir, dry=True))
    finally:
        receiver.close()
    return PushNeeded(remote.label, plan.content, plan.total, int(have.get("send") or 0), int(have.get("free") or 0),
                      folder=str(have.get("dir") or ""))


def push(remote: Remote, plan: PushPlan, workdir: str, emit: EventSink) -> Pushed:
    """Push `plan` into the workdir's models dir on this host: its place there and the bytes sent, or one line of
    error (what arrived stays staged for the next push)."""
    began = time.monotonic()
    emit(PhaseEntered(phase=PHASE, elapsed=0.0, line=f"{plan.describe()} to {remote.label}"))
    receiver = Receiver(remote, plan, workdir)
    try:
        have = receiver.ask(plan.request(workdir), emit)
        sending = Sending(receiver, emit, began, plan.total - int(have.get("send") or 0))
        offsets: dict[str, int] = {}
        for f, state in zip(plan.files, have.get("have") or []):
            if state.get("corrupt"):
                emit(Warn(message=f"{f.name} on {remote.label} is not what was pushed (changed there): sending it "
                                  "again"))
            if not state.get("whole"):
                offsets[f.name] = int(state.get("offset") or 0)
        bad = sending.send([f for f in plan.files if f.name in offsets], offsets)
        if bad:  # a staged file that did not check out: once more from its start
            for name, why in bad.items():
                emit(Warn(message=f"{why}; sending it again"))
            again = sending.send([f for f in plan.files if f.name in bad], {})
            if again:
                raise TransferFailed(f"{receiver.what}: {next(iter(again.values()))} (twice)", host=None)
        done = receiver.ask({"finish": True})
    finally:
        receiver.close()
    return Pushed(remote.label, plan.content, str(done.get("dir") or ""), sending.sent, plan.total, len(plan.files),
                  time.monotonic() - began)


class Sending:
    """The pieces of the files to send, in bulk puts of up to BATCH bytes, each appended and each file sealed."""

    def __init__(self, receiver: Receiver, emit: EventSink, began: float, there: int) -> None:
        self.receiver, self.emit, self.began = receiver, emit, began
        self.sent, self.there = 0, there
        self.last_said = 0.0

    def send(self, files: list[LocalFile], offsets: dict[str, int]) -> dict[str, str]:
        """Every byte of `files` from its offset; the files whose staged copy did not check out, and why."""
        bad: dict[str, str] = {}
        batch: list[Piece] = []
        for piece in _pieces(files, offsets):
            batch.append(piece)
            if sum(p.size for p in batch) >= BATCH:
                bad.update(self._put(batch))
                batch = []
        bad.update(self._put(batch))
        return bad

    def _put(self, batch: list[Piece]) -> dict[str, str]:
        if not batch:
            return {}
        receiver, bad = self.receiver, dict[str, str]()
        names = [f"{p.index}-{p.offset}" for p in batch]
        datas = [p.read() for p in batch]
        receiver.remote.put_all([(data, posixpath.join(receiver.chunks, name), 0o600)
                                 for data, name in zip(datas, names)])
        for piece, name, data in zip(batch, names, datas):
            if piece.file.name in bad:
                continue
            said = receiver.ask({"append": piece.file.name, "chunk": name, "offset": piece.offset,
                                 "sha256": hashlib.sha256(data).hexdigest()})
            if "bad" in said:
                bad[piece.file.name] = str(said.get("message"))
                continue
            self.sent += piece.size
            if piece.last:
                sealed = receiver.ask({"seal": piece.file.name})
                if "bad" in sealed:
                    bad[piece.file.name] = str(sealed.get("message"))
            self._progress(piece.file.name)
        return bad

    def _progress(self, name: str) -> None:
        now = time.monotonic()
        if now - self.last_said < 1.0:
            return
        self.last_said, elapsed = now, now - self.began
        total, done = self.receiver.plan.total, min(self.there + self.sent, self.receiver.plan.total)
        rate = int(self.sent / elapsed) if elapsed > 0 else 0
        percent = round(100.0 * done / total, 1) if total else 100.0
        text = f"{name} {percent:.0f}% {size_text(done)}/{size_text(total)} {size_text(rate)}/s"
        self.emit(Progressed(phase=PHASE, elapsed=round(elapsed, 2), line=text,
                             download=Download(file=name, percent=percent, text=text, bytes=done, total_bytes=total,
                                               rate_bytes_s=rate, source="push")))


def _pieces(files: list[LocalFile], offsets: dict[str, int]) -> Iterator[Piece]:
    for index, f in enumerate(files):
        offset = offsets.get(f.name, 0)
        if offset >= f.size and f.size:
            offset = f.size  # whole but not sealed (a push cut before its seal): sealed below with nothing sent
        while True:
            size = min(BATCH, f.size - offset)
            yield Piece(index, f, offset, size)
            offset += size
            if offset >= f.size:
                break

