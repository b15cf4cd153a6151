#!/usr/bin/env python3
"""The read-only snapshot of a deployment that the on-call commands ask for in one round trip (issue 13).

Runs on the TARGET (stdlib only, Python >= 3.8), in the helper (its `snapshot` request: helper.py;
it is not pushed into run dirs, so `up` uploads nothing more).
`python3 snapshot.py DIR [--runs N|all] [--log-tail BYTES|--log-lines N] [--previous]
[--attempt failed|current]`
prints one JSON object: the deployment's run ids, the current one, the records (profile/state/outcome) of the
runs asked for, the live status of the current run (what `supervise.py status` says), the env file of the
runs whose text will be shown (so it can be masked), the engine.log window (or its last N lines, each long one by
its ends and the exact bytes cut between them) of the run `logs` shows, and with
--attempt the log windows the diagnosis reads of the newest failed run (or of a crashed current run).
`--workdir` treats DIR as a workdir and snapshots every deployment under it (current runs, --attempt current).
Every read is bounded; a missing file is null and a damaged one is null plus a line under "unreadable";
nothing here writes, and bad input exits 2 with one stderr line, never a traceback.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from typing import Any, Callable

from .supervise import status_of
from .base import CRASHED, EXIT_BAD_INPUT, SuperviseError
from .protocol import ENGINE_LOG, OUTCOME_JSON, PROFILE_JSON, STATE_JSON

RECORDS = (PROFILE_JSON, STATE_JSON, OUTCOME_JSON)
RECORD_LIMIT = 4 << 20       # one JSON record (the deployer reads no more of one either)
ENV_LIMIT = 1 << 20          # one env file
LOG_LIMIT = 48 << 20         # the engine.log window one snapshot carries (`logs -n 100000` wants 40 MB)
TOTAL_LIMIT = 64 << 20       # all records of one snapshot together; later runs' records are then left out
LINE_KEEP = 8 << 10          # `--log-lines`: each end of a longer line (a shorter one comes whole)
LINES_SCAN = 1 << 30         # `--log-lines` looks back at most this far for where its lines start
SCAN_BLOCK = 1 << 20
LOG_NAME = ENGINE_LOG
LOCK_EVENTS = "lock-events.jsonl"  # the lease program's takeovers and breaks (deployer.box.push.Layout.lock_events)
# An attempt's log as the diagnosis reads it (the deployer's attempt_log): its first traceback and its tail.
DIAG_WINDOW, TAIL_WINDOW = 1 << 20, 512 << 10
TRACEBACK = b"Traceback (most recent call last)"
DMESG_LINES = 300
LOCK_LIMIT = 64 << 10        # the lock file (a lease record) and the tail of its events


def _read_bounded(path: str, limit: int) -> tuple[bytes | None, str | None]:
    """(data, None); (None, None) for a missing file; (None, why) for one that cannot be read or is too big."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, e.strerror or str(e)
    if len(data) > limit:
        return None, f"larger than {limit} bytes"
    return data, None


def read_record(path: str) -> tuple[dict[str, Any] | None, str | None]:
    """A JSON object record: (data, None), (None, None) when absent, (None, why) when damaged or unreadable."""
    data, why = _read_bounded(path, RECORD_LIMIT)
    if data is None:
        return None, why
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        return None, f"not JSON: {e}"
    if not isinstance(value, dict):
        return None, f"not a JSON object ({type(value).__name__})"
    return value, None


def list_runs(root: str) -> list[str]:
    """Run ids, oldest first (ids start with a UTC timestamp); hidden entries are not runs."""
    try:
        names = os.listdir(os.path.join(root, "runs"))
    except OSError:
        return []
    return sorted(n for n in names if n and not n.startswith("."))


def current_run(root: str) -> str | None:
    try:
        link = os.readlink(os.path.join(root, "current"))
    except OSError:
        return None
    return os.path.basename(link.rstrip("/")) or None


def _records(run_dir: str, budget: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {"unreadable": {}}
    for name in RECORDS:
        key = name[:-5]
        if budget[0] <= 0:
            out[key] = None
            out["unreadable"][name] = "left out: snapshot size limit"
            continue
        value, why = read_record(os.path.join(run_dir, name))
        out[key] = value
        if why:
            out["unreadable"][name] = why
        elif value is not None:
            budget[0] -= len(json.dumps(value))
    return out


def _env_text(run_dir: str) -> str | None:
    data, why = _read_bounded(os.path.join(run_dir, "env"), ENV_LIMIT)
    return None if data is None else data.decode("utf-8", "replace")


def log_window(path: str, tail: int) -> dict[str, Any]:
    """The last `tail` bytes (at most LOG_LIMIT) of a log: {size, start, data (base64)} or {size: 0, error}."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            want = min(size, tail, LOG_LIMIT)
            f.seek(size - want)
            data = f.read(want)
    except FileNotFoundError:
        return {"size": 0, "start": 0, "data": ""}
    except OSError as e:
        return {"size": 0, "start": 0, "data": "", "error": e.strerror or str(e)}
    return {"size": size, "start": size - want, "data": base64.b64encode(data).decode("ascii")}


def log_lines(path: str, n: int) -> dict[str, Any]:
    """The last `n` non-blank lines of a log, whatever their length: {size, start, lines, first_partial}.

    Each line is [head, cut, tail] (head and tail base64, `cut` the exact number of bytes left out between them;
    a line of at most twice `_line_keep(n)` bytes is all head, cut 0). The log is read backwards in blocks from its
    end, at most LINES_SCAN bytes: when that ends inside a line, its start was not read (`first_partial`, its
    head then begins at `start`).
    """
    keep = _line_keep(n)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            spans, start, partial = _line_spans(f, size, n, keep)
            lines = [_line_ends(f, a, b, keep) for a, b in spans]
    except FileNotFoundError:
        return {"size": 0, "start": 0, "lines": [], "first_partial": False}
    except OSError as e:
        return {"size": 0, "start": 0, "lines": [], "first_partial": False, "error": e.strerror or str(e)}
    return {"size": size, "start": start, "lines": lines, "first_partial": partial}


def _line_keep(n: int) -> int:
    """Bytes kept of each end of a long line: LINE_KEEP, less when many lines are asked for (LOG_LIMIT in all)."""
    return max(128, min(LINE_KEEP, LOG_LIMIT // (2 * max(n, 1))))


def _line_spans(f: Any, size: int, n: int, keep: int) -> tuple[list[tuple[int, int]], int, bool]:
    """(start, end) of the last `n` non-blank lines, oldest first; where the first begins; whether its start lies
    before what was scanned."""
    floor, pos, end = max(0, size - LINES_SCAN), size, size
    spans: list[tuple[int, int]] = []
    while pos > floor and len(spans) < n:
        step = min(SCAN_BLOCK, pos - floor)
        f.seek(pos - step)
        buf = f.read(step)
        i = len(buf)
        while len(spans) < n:
            j = buf.rfind(b"\n", 0, i)
            if j < 0:
                break
            if not _blank(f, pos - step + j + 1, end, keep):
                spans.append((pos - step + j + 1, end))
            end, i = pos - step + j, j
        pos -= step
    partial = False
    if len(spans) < n and end > pos and not _blank(f, pos, end, keep):
        spans.append((pos, end))  # the first line of the log, or one that began before the scan's floor
        partial = pos > 0
    spans.reverse()
    return spans, spans[0][0] if spans else size, partial


def _blank(f: Any, start: int, end: int, keep: int) -> bool:
    if end - start > 2 * keep:
        return False
    f.seek(start)
    return not f.read(end - start).strip()


def _line_ends(f: Any, start: int, end: int, keep: int) -> list[Any]:
    if end - start <= 2 * keep:
        f.seek(start)
        return [base64.b64encode(f.read(end - start)).decode("ascii"), 0, ""]
    f.seek(start)
    head = f.read(keep)
    f.seek(end - keep)
    tail = f.read(keep)
    return [base64.b64encode(head).decode("ascii"), end - start - 2 * keep, base64.b64encode(tail).decode("ascii")]


def rotated_window(path: str, tail: int, log_head: Any) -> dict[str, Any]:
    """log_window across the supervisor's rotation (daemon.LogRotation): once engine.log was cut back
    to its startup part and a marker ending at `log_head` (state.json), its last lines are what follows the marker
    preceded by the end of engine.log.1. `start` then counts the bytes of .1 before the window (0: all of it)."""
    window = log_window(path, tail)
    if not isinstance(log_head, int) or isinstance(log_head, bool) or not 0 < log_head <= window["size"] \
            or window["start"] >= log_head:
        return window
    try:
        with open(path, "rb") as f:
            f.seek(log_head)
            new = f.read(min(window["size"] - log_head, LOG_LIMIT))
        fd = os.open(path + ".1", os.O_RDONLY | os.O_NOFOLLOW)
        with open(fd, "rb") as f:
            older = os.fstat(f.fileno()).st_size
            want = max(min(tail, LOG_LIMIT) - len(new), 0)
            f.seek(older - min(want, older))
            before = f.read(min(want, older))
    except OSError:
        return window
    return {"size": window["size"], "start": older - len(before),
            "data": base64.b64encode(before + new).decode("ascii")}


def log_run(runs: list[str], current: str | None, previous: bool) -> str | None:
    """The run `deploy logs` shows: the current one (else the newest), or the one before it."""
    if not runs:
        return None
    shown = current or runs[-1]
    if previous:
        older = [r for r in runs if r < shown]
        return older[-1] if older else None
    return shown


def failed_run(runs: list[str], records: dict[str, Any]) -> str | None:
    """The newest run whose engine died or whose attempt did not end ready (what `deploy diagnose` explains)."""
    for run_id in reversed(runs):
        rec = records.get(run_id) or {}
        state, outcome = rec.get("state") or {}, rec.get("outcome") or {}
        if state.get("status") in CRASHED or state.get("last_crash") or outcome.get("outcome") not in (None, "ready"):
            return run_id
    return None


def find_traceback(path: str, offset: int) -> int | None:
    """Where the line holding the first traceback at or after `offset` starts (as `grep -b -m1` says), or None."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            base, line_start, carry = offset, offset, b""
            while True:
                chunk = f.read(1 << 20)
                if not chunk:
                    return None
                buf = carry + chunk
                found = buf.find(TRACEBACK)
                if found >= 0:
                    nl = buf.rfind(b"\n", 0, found)
                    return base + nl + 1 if nl >= 0 else line_start
                nl = buf.rfind(b"\n")
                if nl >= 0:
                    line_start = base + nl + 1
                carry = buf[-(len(TRACEBACK) - 1):]
                base += len(buf) - len(carry)
    except OSError:
        return None


def _read_at(path: str, start: int, limit: int) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(limit)
    except OSError:
        data = b""
    return {"start": start, "data": base64.b64encode(data).decode("ascii")}


def attempt(run_dir: str, state: dict[str, Any]) -> dict[str, Any]:
    """The windows of the run's last engine life the diagnosis reads, plus the kernel's log for a death by signal."""
    end = state.get("last_crash") or state
    end = end if isinstance(end, dict) else state
    path = os.path.join(run_dir, LOG_NAME)
    offset, known = end.get("log_offset"), end.get("traceback_offset")
    offset = offset if isinstance(offset, int) and offset > 0 else 0
    try:
        size = os.path.getsize(path)
    except OSError:
        size = 0
    if size - offset <= DIAG_WINDOW + TAIL_WINDOW:
        windows = [_read_at(path, offset, DIAG_WINDOW + TAIL_WINDOW)]
    else:
        start = known if isinstance(known, int) and known >= offset else find_traceback(path, offset)
        windows = [_read_at(path, start, DIAG_WINDOW)] if start is not None else []
        tail_from = max(offset, size - TAIL_WINDOW, start + DIAG_WINDOW if start is not None else 0)
        windows.append(_read_at(path, tail_from, TAIL_WINDOW))
    return {"size": size, "windows": windows, "dmesg": _dmesg() if end.get("signal") else None}


def _dmesg() -> str | None:
    """The kernel log's tail (the OOM killer's lines); None where it cannot be read (no permission, no dmesg)."""
    try:
        proc = subprocess.run(["dmesg"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, timeout=15)
    except (OSError, subprocess.SubprocessError):
        return None
    return "\n".join(proc.stdout.decode("utf-8", "replace").splitlines()[-DMESG_LINES:])


def deployment(root: str, runs_wanted: int | None, log_tail: int | None, previous: bool,
               which_attempt: str | None = None, log_count: int | None = None,
               live: Callable[[str], dict[str, Any]] = status_of) -> dict[str, Any]:
    """Everything the on-call read commands need of one deployment dir (`log_tail`: the log's last bytes,
    `log_count`: its last lines; `live`: a run dir's live status, what `supervise.py status` says)."""
    runs, current = list_runs(root), current_run(root)
    shown = log_run(runs, current, previous) if log_tail is not None or log_count is not None else None
    picked = set(runs if runs_wanted is None else runs[len(runs) - runs_wanted:] if runs_wanted else [])
    picked.update(r for r in (current, shown) if r)
    budget = [TOTAL_LIMIT]
    records = {r: _records(os.path.join(root, "runs", r), budget) for r in runs if r in picked}
    if current and current not in records:  # `current` names a run dir that is gone
        records[current] = _records(os.path.join(root, "runs", current), budget)
    status = None
    if current:
        try:
            status = live(os.path.join(root, "runs", current))
        except SuperviseError as e:
            status = {"status": "absent", "error": str(e)[:300]}
    told = None  # the run whose attempt is diagnosed: the newest failed one, or a crashed current one
    if which_attempt == "failed":
        told = failed_run(runs, records)
    elif which_attempt == "current" and current and (status or {}).get("status") in CRASHED:
        told = current
    env = {r: _env_text(os.path.join(root, "runs", r)) for r in (current, shown, told) if r}
    log = None
    if shown is not None and log_count is not None:
        log = dict(log_lines(os.path.join(root, "runs", shown, LOG_NAME), log_count), run=shown)
    elif shown is not None and log_tail is not None:
        shown_state = (status if shown == current else None) or (records.get(shown) or {}).get("state") or {}
        log = dict(rotated_window(os.path.join(root, "runs", shown, LOG_NAME), log_tail,
                                  shown_state.get("log_head")), run=shown)
    diag = None
    if told is not None:
        state = (status if told == current else None) or records.get(told, {}).get("state") or {}
        diag = dict(attempt(os.path.join(root, "runs", told), state), run=told)
    return {"root": root, "exists": os.path.isdir(os.path.join(root, "runs")), "runs": runs, "current": current,
            "records": records, "status": status, "env": env, "log": log, "attempt": diag,
            "lock": _text(os.path.join(root, "lock")), "lock_events": _tail_text(os.path.join(root, LOCK_EVENTS))}


def _text(path: str) -> str | None:
    data, _ = _read_bounded(path, LOCK_LIMIT)
    return None if data is None else data.decode("utf-8", "replace")


def _tail_text(path: str) -> str:
    """The end of an append-only JSON-lines file (its first line may be cut: the reader skips it)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - LOCK_LIMIT))
            return f.read(LOCK_LIMIT).decode("utf-8", "replace")
    except OSError:
        return ""


def workdir(path: str, live: Callable[[str], dict[str, Any]] = status_of) -> dict[str, Any]:
    """Every deployment under a workdir (directories that have a runs/ dir), each with its current run only."""
    try:
        names = sorted(n for n in os.listdir(path) if not n.startswith(".")
                       and os.path.isdir(os.path.join(path, n)) and os.path.exists(os.path.join(path, n, "runs")))
    except OSError:
        names = []
    return {"workdir": path,
            "deployments": {n: deployment(os.path.join(path, n), 0, None, False, "current", live=live)
                            for n in names}}


def _count(opts: dict[str, str], name: str) -> int | None:
    value = opts.get(name)
    if value is None or value == "all":
        return None
    if not value.isdigit():
        raise SuperviseError(f"--{name} wants a count, not {value!r}", EXIT_BAD_INPUT)
    return int(value)


def _parse(argv: list[str]) -> tuple[str, dict[str, str], set[str]]:
    pos: list[str] = []
    opts: dict[str, str] = {}
    flags: set[str] = set()
    rest = list(argv)
    while rest:
        word = rest.pop(0)
        if word in ("--previous", "--workdir"):
            flags.add(word[2:])
        elif word in ("--runs", "--log-tail", "--log-lines", "--attempt"):
            if not rest:
                raise SuperviseError(f"{word} needs a value", EXIT_BAD_INPUT)
            opts[word[2:]] = rest.pop(0)
        elif word.startswith("--"):
            raise SuperviseError(f"unknown option {word}", EXIT_BAD_INPUT)
        else:
            pos.append(word)
    if len(pos) != 1:
        raise SuperviseError("usage: snapshot DIR [--runs N|all] [--log-tail BYTES|--log-lines N] [--previous] "
                             "[--attempt failed|current] [--workdir]", EXIT_BAD_INPUT)
    if opts.get("attempt", "failed") not in ("failed", "current"):
        raise SuperviseError(f"--attempt is failed or current, not {opts['attempt']!r}", EXIT_BAD_INPUT)
    return pos[0], opts, flags


def snapshot(argv: list[str], live: Callable[[str], dict[str, Any]] = status_of) -> dict[str, Any]:
    """The snapshot `argv` asks for; `live`: a run dir's live status (the helper's own supervisor answer)."""
    path, opts, flags = _parse(argv)
    root = os.path.abspath(os.path.expanduser(path))  # `~/x` arrives unexpanded: the target's home, no extra trip
    if "workdir" in flags:
        return workdir(root, live)
    runs = _count(opts, "runs") if "runs" in opts else 0
    return deployment(root, runs, _count(opts, "log-tail") if "log-tail" in opts else None, "previous" in flags,
                      opts.get("attempt"), _count(opts, "log-lines") if "log-lines" in opts else None, live)


def main(argv: list[str] | None = None) -> int:
    try:
        data = snapshot(sys.argv[1:] if argv is None else argv)
    except SuperviseError as e:
        print(f"supervise: {e}", file=sys.stderr, flush=True)
        return e.code
    sys.stdout.write(json.dumps(data, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
