"""Diagnosis: an engine log -> its first traceback -> the known failure signature it matches (`Diagnosis`).

Signatures are data (`engines/<kind>/signatures.yaml`, then the engine-neutral `engines/common/signatures.yaml`),
tried in that order: first against the final
exception lines of the first traceback, then the whole traceback, then the lines right after it, then the
tail of the log (argparse, uvicorn, NCCL and "scheduler died" errors are not tracebacks). Pure, except
`diagnose_file`, which reads a bounded window of a log of any size.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import re
import signal as signals
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from deployer.diagnose.drift import masked, parse_args_dump
from deployer.remedy.effective import ENGINE_RESOLVED, PROFILE, EngineValues
from deployer.engines import Engine
from deployer.engines import all_secret_flags
from deployer.engines import engine_for
from deployer.logtext import ANSI_RE, clip, readable
from deployer.remedy.propose import RemedySpec, resolve
from deployer.versions import version_in
from deployer.supervisor.probe import NO_TOKEN
from deployer.diagnose.signatures import Signature, load_signatures

TB_MARK = "Traceback (most recent call last):"
_TS_RE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?)([^\]]*)\] ?")
_CHAIN_RE = re.compile(
    r"^(During handling of the above exception, another exception occurred:"
    r"|The above exception was the direct cause of the following exception:)$"
)
_PROGRESS_RE = re.compile(r"\d+%\||\d+% Completed \|")
_OOM_KILL_RE = re.compile(r"Out of memory: Killed process|oom-kill:|invoked oom-killer|Memory cgroup out of memory")
MAX_MESSAGE_LINES = 40      # an exception message longer than this is cut (the rest is still in the log)
BLOCK_CHARS = 2 << 20       # how far past its start a traceback is parsed
TAIL_CHARS = 256 << 10      # how much of the log's end the non-traceback errors are looked for in
CONTEXT_BYTES = 64 << 10    # diagnose_file: bytes kept before the first traceback
LINE_CHARS = 4096           # one line as matched against the signatures: a hostile 8 MB line costs what 4 KB does
MAX_TRACEBACKS = 8          # how many tracebacks of one log are tried (harmless ones can come first)


@dataclass(frozen=True)
class Line:
    """One log line without ANSI codes, progress-bar redraws and the logger's timestamp prefix."""

    text: str
    tag: str | None          # rank tag of a timestamped line ("TP0", "" for none); None when not timestamped
    stamped: bool = False
    prefixed: bool = False   # carried the engine's own logger prefix (LogFormat.prefix)


def clean_line(raw: str, prefix: re.Pattern[str] | None = None) -> Line:
    """`prefix`: the engine's own logger prefix (LogFormat.prefix), stripped too; its group "tag" is the rank."""
    text = clip(readable(raw), LINE_CHARS)
    found = _TS_RE.match(text)
    if found:
        return Line(text[found.end():].rstrip(), found.group(2).strip(), True)
    own = prefix.match(text) if prefix is not None else None
    if own is not None and own.end() > 0:
        return Line(text[own.end():].rstrip(), own.group("tag") or "", True, True)
    return Line(text.rstrip(), None)


@dataclass(frozen=True)
class Traceback:
    """The first traceback of a log with its chained exceptions, cleaned."""

    text: str                        # the whole block, chained parts included, ending with the final exception
    exception: str                   # the final exception line(s): "ValueError: ..." (multi-line message kept)
    exceptions: tuple[str, ...]      # every part's exception, oldest first (the final one last)
    rank: str | None = None          # rank tag of the process that printed it ("TP0"), "" if none, None if unknown
    prefix: str | None = None        # what preceded it on its first line ("Scheduler hit an exception:")
    after: tuple[str, ...] = ()      # a few cleaned lines that followed it

    @property
    def exception_type(self) -> str:
        head = self.exception.split("\n", 1)[0]
        return head.split(":", 1)[0].strip()


def first_traceback(text: str, log_prefix: re.Pattern[str] | None = None) -> Traceback | None:
    """The first `Traceback (most recent call last):` block of `text`, or None (`log_prefix`: see clean_line)."""
    start = text.find(TB_MARK)
    if start < 0 and "\x1b" in text:
        text = ANSI_RE.sub("", text)
        start = text.find(TB_MARK)
    if start < 0:
        return None
    line_start = text.rfind("\n", 0, start) + 1
    lines = _record_lines(text[line_start:line_start + BLOCK_CHARS].split("\n"), log_prefix)
    parsed = _parse_block(lines, 0)
    if parsed is None:
        return None
    parts, end = parsed
    first = lines[0]
    prefix = first.text[: first.text.find(TB_MARK)].strip() if TB_MARK in first.text else ""
    after = tuple(ln.text for ln in lines[end:end + 8] if ln.text.strip())
    body: list[str] = []
    for marker, frames, exc in parts:
        if marker:
            body += ["", marker, ""]
        body += [TB_MARK, *frames, *exc]
    return Traceback(
        text="\n".join(body),
        exception="\n".join(parts[-1][2]),
        exceptions=tuple("\n".join(exc) for _, _, exc in parts),
        rank=first.tag,
        prefix=prefix or None,
        after=after,
    )


def _record_lines(raws: list[str], log_prefix: re.Pattern[str] | None) -> list[Line]:
    """Cleaned lines; a line with the engine's logger prefix after one that ends in \\r continues the same record
    (a formatter may re-prefix each line of a multi-line message after "\\r\\n"), so it is not a new record
    even though it is prefixed. Lines without the prefix (`[date time TAG]` timestamps) keep their own meaning."""
    lines = [clean_line(raw, log_prefix) for raw in raws]
    for i in range(1, len(lines)):
        if lines[i].prefixed and raws[i - 1].endswith("\r"):
            lines[i] = Line(lines[i].text, lines[i].tag, False, True)
    return lines


_Part = tuple[str | None, list[str], list[str]]   # (chain marker before it, frame lines, exception lines)


def _parse_block(lines: list[Line], i: int) -> tuple[list[_Part], int] | None:
    """Parse a traceback whose header is lines[i]; returns its parts and the index after it."""
    parts: list[_Part] = []
    marker: str | None = None
    i += 1
    while True:
        frames: list[str] = []
        i = _parse_frames(lines, i, frames)
        if i >= len(lines):
            if frames:
                parts.append((marker, frames, ["(log ends inside the traceback)"]))
            return (parts, i) if parts else None
        exc = [lines[i].text]
        i = _parse_message(lines, i + 1, exc, lines[i].prefixed)
        parts.append((marker, frames, exc))
        marker, nxt = _chained(lines, i)
        if marker is None:
            return parts, i
        i = nxt


def _parse_frames(lines: list[Line], i: int, frames: list[str]) -> int:
    """Collect indented frame lines; skip other ranks' records. Returns the index of the exception line."""
    while i < len(lines):
        line = lines[i]
        if line.stamped:
            i = _skip_record(lines, i)
            continue
        if not line.text.strip() or _PROGRESS_RE.search(line.text):
            i += 1
            continue
        if not line.text.startswith(" "):
            return i
        frames.append(line.text)
        i += 1
    return i


def _skip_record(lines: list[Line], i: int) -> int:
    """Skip a timestamped line of another record; if it opens a traceback, skip that traceback too."""
    if TB_MARK not in lines[i].text:
        return i + 1
    parsed = _parse_block(lines, i)
    return parsed[1] if parsed else i + 1


def _parse_message(lines: list[Line], i: int, exc: list[str], prefixed: bool = False) -> int:
    """Extend the exception line with its message's further lines; stop at the next record or a blank.

    `prefixed`: the exception came through the engine's logger, so its further lines carry the prefix too."""
    while i < len(lines) and len(exc) < MAX_MESSAGE_LINES:
        line = lines[i]
        text = line.text
        if line.stamped or not text.strip() or _CHAIN_RE.match(text.strip()) or line.prefixed != prefixed:
            break
        if text.startswith(TB_MARK) or _PROGRESS_RE.search(text):
            break
        exc.append(text)
        i += 1
    return i


def _chained(lines: list[Line], i: int) -> tuple[str | None, int]:
    """After an exception: a chain marker then another traceback? Returns (marker, index after its header)."""
    j = _next_text(lines, i)
    if j is None or lines[j].stamped or not _CHAIN_RE.match(lines[j].text.strip()):
        return None, i
    k = _next_text(lines, j + 1)
    if k is None or lines[k].text.strip() != TB_MARK:
        return None, i
    return lines[j].text.strip(), k + 1


def _next_text(lines: list[Line], i: int) -> int | None:
    while i < len(lines) and not lines[i].text.strip():
        i += 1
    return i if i < len(lines) else None


@dataclass(frozen=True)
class Diagnosis:
    """What went wrong with one attempt, and what the signature's data says to do about it."""

    signature: str | None
    summary: str
    transient: bool
    evidence: list[str] = field(default_factory=list)
    traceback: str | None = None
    remedy: RemedySpec | None = None
    hint: str | None = None
    engine_args: dict[str, Any] | None = None   # the attempt's own args dump (LogFormat.args_dump), if any
    context: str = ""                           # more of the log a remedy may read (argparse's usage text)
    engine_version: str | None = None           # the engine version the log is from, when known
    engine_kind: str | None = None              # the engine whose tables matched (None: no engine's, e.g. a hang)

    def message_text(self) -> str:
        """The text a remedy reads values from (the matching lines, the traceback, the error's context)."""
        return "\n".join([*self.evidence, self.traceback or "", self.context])

    def engine_values(self, profile_args: dict[str, Any] | None = None) -> EngineValues:
        """What the engine used: its dump in this log, then the profile's args."""
        return EngineValues().then(ENGINE_RESOLVED, self.engine_args).then(PROFILE, profile_args)

    def to_json(self) -> dict[str, Any]:
        change = None
        if self.remedy is not None and self.engine_kind is not None:
            change = resolve(self.remedy, self.message_text(), args={}, env={}, values=self.engine_values(),
                             version=self.engine_version, engine=engine_for(self.engine_kind))
        remedy = None if change is None else {"args": dict(change.args), "env": dict(change.env),
                                              "reason": change.reason}
        return {
            "signature": self.signature,
            "summary": self.summary,
            "transient": self.transient,
            "evidence": list(self.evidence),
            "traceback": self.traceback,
            "remedy": remedy,
        }


def diagnose(
    text: str,
    *,
    engine_version: str | None = None,
    exit_code: int | None = None,
    signal: int | None = None,
    engine: Engine | None,
) -> Diagnosis:
    """Diagnose one attempt from (a bounded window of) its log and how the process ended.

    `engine`: the engine the log is from (its own signatures, then the engine-neutral ones); None when that cannot
    be told (`deployer.engines.detect` found no engine's marks): the engine-neutral signatures only."""
    signatures = [s for s in load_signatures(engine)
                  if engine_version is None or version_in(engine_version, s.versions)]
    prefix = engine.log.prefix if engine is not None else None
    tbs = tracebacks(text, log_prefix=prefix)
    tail = _tail_lines(text, prefix)
    # A harmless traceback (a warning logged with its stack) can come first: each traceback in turn, then the tail.
    stages = [(stage, tb) for tb in tbs for stage in _stages(tb)] + [("\n".join(tail), tbs[0] if tbs else None)]
    for stage, tb in stages:
        for sig in signatures:
            found = sig.search(stage)
            if found and sig.fits(text):
                matched = _matched(sig, stage, found, tb)
                dump = parse_args_dump(text, engine.log.args_dump) if engine is not None else None
                secret = engine.launch.secret_flags if engine is not None else all_secret_flags()
                return dataclasses.replace(matched, engine_args=dump and masked(dump, secret),
                                           context=_usage(tail), engine_version=engine_version,
                                           engine_kind=engine.kind if engine is not None else None)
    signum = signal if signal is not None else _signal_of_exit(exit_code)
    if not tbs and signum is not None:
        return killed_by_signal(signum, tail)
    return _unknown(_fatal(tbs), tail)


def tracebacks(text: str, limit: int = MAX_TRACEBACKS, log_prefix: re.Pattern[str] | None = None) -> list[Traceback]:
    """The first `limit` tracebacks of `text`, in order (chained parts belong to their traceback;
    `log_prefix`: see clean_line)."""
    found: list[Traceback] = []
    start = 0
    while len(found) < limit:
        pos = text.find(TB_MARK, start)
        if pos < 0:
            break
        begin = text.rfind("\n", 0, pos) + 1
        tb = first_traceback(text[begin: begin + BLOCK_CHARS], log_prefix)
        if tb is None:
            break
        found.append(tb)
        start = _after(text, pos, tb)
    return found


def _after(text: str, pos: int, tb: Traceback) -> int:
    """Past a chained traceback: after its last part's header."""
    at = pos
    for _ in range(tb.text.count(TB_MARK)):
        nxt = text.find(TB_MARK, at)
        if nxt < 0:
            break
        at = nxt + len(TB_MARK)
    return at


def _fatal(tbs: list[Traceback]) -> Traceback | None:
    """For an unknown failure: the first traceback that is not a logged warning's, else the first."""
    for tb in tbs:
        if not (tb.prefix and "warn" in tb.prefix.lower()):
            return tb
    return tbs[0] if tbs else None


def _stages(tb: Traceback) -> list[str]:
    return ["\n".join(tb.exceptions), tb.text, "\n".join([tb.prefix or "", *tb.after])]


def _usage(tail: list[str]) -> str:
    """argparse's usage block before its error (it lists every flag the engine knows: did-you-mean reads it)."""
    starts = [i for i, line in enumerate(tail) if line.startswith("usage: ")]
    if not starts:
        return ""
    block = tail[starts[-1]:]
    end = next((i for i, line in enumerate(block) if ": error: " in line), len(block) - 1)
    return "\n".join(block[: end + 1])


def _tail_lines(text: str, prefix: re.Pattern[str] | None = None) -> list[str]:
    chunk = text[-TAIL_CHARS:]
    if len(text) > TAIL_CHARS:
        chunk = chunk[chunk.find("\n") + 1:]
    return [ln.text for ln in (clean_line(raw, prefix) for raw in chunk.split("\n")) if ln.text.strip()]


def _matched(sig: Signature, stage: str, found: re.Match[str], tb: Traceback | None) -> Diagnosis:
    begin = stage.rfind("\n", 0, found.start()) + 1
    end = stage.find("\n", found.end())
    lines = stage[begin: end if end >= 0 else len(stage)].split("\n")
    whole = next((exc for exc in (tb.exceptions if tb else ()) if found.group(0) in exc), None)
    if whole is not None and len(whole) > len(found.group(0)):
        lines = whole.split("\n")   # the whole (multi-line) exception that matched
    return Diagnosis(
        signature=sig.id,
        summary=_expand(sig.summary, found),
        transient=sig.transient,
        evidence=evidence_lines(lines)[:8],
        traceback=tb.text if tb else None,
        remedy=sig.remedy,
        hint=_expand(sig.hint, found) if sig.hint else None,
    )


def _expand(template: str, found: re.Match[str]) -> str:
    """Signature texts may name what the pattern captured: `\\g<1>`."""
    if "\\g<" not in template:
        return template
    try:
        return found.expand(template)
    except (IndexError, re.error):
        return template


@lru_cache(maxsize=1)
def _noise() -> tuple[re.Pattern[str], ...]:
    from deployer.engines.common import noise_patterns

    return noise_patterns()


def evidence_lines(lines: list[str]) -> list[str]:
    """The lines worth showing as evidence: stripped, shortened, without the engine-neutral noise
    (engines/common/noise.yaml: `Possible solutions:`, a warning's echoed `warnings.warn(` ...)."""
    kept = [ln.strip() for ln in lines if ln.strip()]
    return [_short(ln) for ln in kept if not any(p.search(ln) for p in _noise())]


def _short(line: str, limit: int = 500) -> str:
    return line if len(line) <= limit else line[:limit] + " ..."


def _unknown(tb: Traceback | None, tail: list[str]) -> Diagnosis:
    if tb is not None:
        last = tb.exception.split("\n", 1)[0]
        return Diagnosis(None, f"unknown failure: {last}", False, evidence_lines(tb.exception.split("\n")), tb.text)
    kept = evidence_lines(tail)
    last = kept[-1] if kept else "no output"
    return Diagnosis(None, f"unknown failure: {last}", False, kept[-5:])


def _signal_of_exit(exit_code: int | None) -> int | None:
    """Shells report death by signal N as 128+N; Python's subprocess as -N."""
    if exit_code is None:
        return None
    if exit_code < 0:
        return -exit_code
    return exit_code - 128 if 128 < exit_code <= 128 + 64 else None


_SIGNAL_CAUSES: dict[int, str] = {
    signals.SIGKILL.value: "most likely the host's OOM killer",
    signals.SIGTERM.value: "something outside the engine stopped it",
    signals.SIGSEGV.value: "a crash in native code (driver, CUDA kernel, extension)",
    signals.SIGABRT.value: "a native abort (CUDA/NCCL assertion, C++ exception)",
    signals.SIGBUS.value: "a bus error (often /dev/shm too small)",
}


def killed_by_signal(signum: int, tail: list[str] | None = None) -> Diagnosis:
    """A death by signal with no traceback to explain it."""
    name = signals.Signals(signum).name if signum in set(signals.Signals) else f"signal {signum}"
    cause = _SIGNAL_CAUSES.get(signum, "see the host's logs")
    how = "with no output" if not tail else "with no error in the log"
    hint = "check `dmesg -T | grep -i -e oom -e killed` on the host; lower host memory use (fewer workers, smaller CPU offload)"
    evidence = evidence_lines(tail or [])[-5:]
    return Diagnosis("killed-by-signal", f"killed by {name} {how}: {cause}", False, evidence, None, None, hint)


def hang_diagnosis(last_lines: list[str], stalled_s: float) -> Diagnosis:
    """The engine's output did not move for `stalled_s` seconds: nothing new, or a frozen progress bar (the pipeline
    noticed and stopped it)."""
    lines = [ln.text for ln in map(clean_line, last_lines) if ln.text.strip()]
    last = lines[-1] if lines else "(no output at all)"
    return Diagnosis(
        signature="hang",
        summary=f"output did not move for {stalled_s:.0f} s; last line: {last}",
        transient=True,
        evidence=lines[-5:],
        hint="a stall at NCCL init often means P2P/IB trouble (try NCCL_P2P_DISABLE=1, NCCL_DEBUG=INFO); "
        "at weight loading, a slow or stuck download or filesystem; raise health.stall_timeout_s if it is just slow",
    )


def oom_killer_lines(dmesg_text: str) -> list[str]:
    """The kernel OOM killer's lines in `dmesg` output."""
    return [line.strip() for line in dmesg_text.splitlines() if _OOM_KILL_RE.search(line)]


def diagnose_file(path: str | os.PathLike[str], *, engine: Engine | None, window_bytes: int = 8 << 20,
                  **kw: Any) -> Diagnosis:
    """`diagnose` a log file of any size (from `engine`), reading at most ~2 windows of it."""
    return diagnose(read_window(path, window_bytes), engine=engine, **kw)


def read_window(path: str | os.PathLike[str], window_bytes: int = 8 << 20) -> str:
    """The log around its first traceback plus its last `window_bytes`, cut at line boundaries."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size <= 2 * window_bytes:
            return f.read().decode("utf-8", "replace")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            tail_start = size - window_bytes
            pos = mm.find(TB_MARK.encode(), 0, tail_start)
            parts = []
            if pos >= 0:
                head = max(0, pos - CONTEXT_BYTES)
                parts.append(_from_line(mm[head: min(pos + window_bytes, tail_start)], head > 0))
            parts.append(_from_line(mm[tail_start:], True))
    return b"\n".join(parts).decode("utf-8", "replace")


def _from_line(chunk: bytes, cut: bool) -> bytes:
    return chunk[chunk.find(b"\n") + 1:] if cut else chunk


GROUP_PEER_LOST = "group-peer-lost"


def group_peer_lost(reason: str, engine_kind: str | None = None) -> Diagnosis:
    """A rank of a node group that its supervisor stopped because a peer was gone (group): the cause is
    on that peer, not in this rank's log (a SIGKILL here is the supervisor's own, for a rank that ignored or could
    not take its SIGTERM, e.g. a stopped one)."""
    return Diagnosis(signature=GROUP_PEER_LOST, summary=f"stopped for its group: {reason}", transient=False,
                     evidence=[reason], hint="the cause is on the peer named here: see its log (deploy logs NAME "
                                             "--node N)", engine_kind=engine_kind)


def peer_lost_reason(end: Any) -> str | None:
    """Why the supervisor stopped this rank for its group (state.json's peer_lost: a record, or last_crash's text);
    None when it did not."""
    lost = end.get("peer_lost") if isinstance(end, dict) else None
    if isinstance(lost, dict):
        lost = lost.get("reason")
    return str(lost) if isinstance(lost, str) and lost else None


def no_token_diagnosis(end: dict[str, Any]) -> Diagnosis | None:
    """The supervisor ended the engine because its one-token probe failed `failures` times in a row while no
    request was running or waiting (probe): its HTTP server answered, its engine generated nothing.
    `end` is the supervisor's record of the crash (state.json's last_crash); None when the probe did not end it."""
    dead = end.get("probe_dead")
    if not isinstance(dead, dict):
        return None
    reason = str(dead.get("reason") or "")
    failures = dead.get("failures")
    evidence = [f"last probe: {clip(reason, 300)}"] if reason else []
    if "health" in dead and dead["health"] != 200:   # a /health that generates a token itself fails too
        health = dead["health"]
        evidence.append(("/health did not answer" if health is None else f"/health answered {health}") +
                        ", and the engine never exited on its own: a frozen engine process")
    return Diagnosis(signature="no-token", transient=True,
                     summary=f"{NO_TOKEN}: {failures} one-token probes in a row failed while no request was running "
                             f"or waiting",
                     evidence=evidence,
                     hint="its HTTP server outlived its engine core (a hung or dead engine process): "
                          "the supervisor ended it as a crash (restart policy); see engine.log around that time")
