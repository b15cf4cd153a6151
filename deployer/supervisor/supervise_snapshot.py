#!/usr/bin/env python3
"""The read-only snapshot of a deployment that the on-call commands ask for in one round trip (issue 13).

Runs on the TARGET (stdlib only, Python >= 3.8), from the deployer's own copy sent over stdin (it is not
pushed into run dirs).  `python3 supervise_snapshot.py DIR [--runs N|all] [--log-tail BYTES] [--previous]`
prints one JSON object: the deployment's run ids, the current one, the records (profile/state/outcome) of the
runs asked for, the live status of the current run (what `supervise.py status` says), the env file of the
runs whose text will be shown (so it can be masked), and the engine.log window of the run `logs` shows.
`--workdir` treats DIR as a workdir and snapshots every deployment under it (current runs only).
Every read is bounded; a missing file is null and a damaged one is null plus a line under "unreadable";
nothing here writes, and bad input exits 2 with one stderr line, never a traceback.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # imported as part of the deployer package
    from deployer.supervisor.supervise import status_of
    from deployer.supervisor.supervise_base import EXIT_BAD_INPUT, SuperviseError
else:  # run on the target, where the supervisor's modules are loaded side by side
    from supervise import status_of  # type: ignore[no-redef]
    from supervise_base import EXIT_BAD_INPUT, SuperviseError  # type: ignore[no-redef]

RECORDS = ("profile.json", "state.json", "outcome.json")
RECORD_LIMIT = 4 << 20       # one JSON record (the deployer reads no more of one either)
ENV_LIMIT = 1 << 20          # one env file
LOG_LIMIT = 48 << 20         # the engine.log window one snapshot carries (`logs -n 100000` wants 40 MB)
TOTAL_LIMIT = 64 << 20       # all records of one snapshot together; later runs' records are then left out
LOG_NAME = "engine.log"


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


def log_run(runs: list[str], current: str | None, previous: bool) -> str | None:
    """The run `deploy logs` shows: the current one (else the newest), or the one before it."""
    if not runs:
        return None
    shown = current or runs[-1]
    if previous:
        older = [r for r in runs if r < shown]
        return older[-1] if older else None
    return shown


def deployment(root: str, runs_wanted: int | None, log_tail: int | None, previous: bool) -> dict[str, Any]:
    """Everything the on-call read commands need of one deployment dir."""
    runs, current = list_runs(root), current_run(root)
    shown = log_run(runs, current, previous) if log_tail is not None else None
    picked = set(runs if runs_wanted is None else runs[len(runs) - runs_wanted:] if runs_wanted else [])
    picked.update(r for r in (current, shown) if r)
    budget = [TOTAL_LIMIT]
    records = {r: _records(os.path.join(root, "runs", r), budget) for r in runs if r in picked}
    if current and current not in records:  # `current` names a run dir that is gone
        records[current] = _records(os.path.join(root, "runs", current), budget)
    status = None
    if current:
        try:
            status = status_of(os.path.join(root, "runs", current))
        except SuperviseError as e:
            status = {"status": "absent", "error": str(e)[:300]}
    env = {r: _env_text(os.path.join(root, "runs", r)) for r in (current, shown) if r}
    log = None
    if shown is not None and log_tail is not None:
        log = dict(log_window(os.path.join(root, "runs", shown, LOG_NAME), log_tail), run=shown)
    return {"root": root, "exists": os.path.isdir(os.path.join(root, "runs")), "runs": runs, "current": current,
            "records": records, "status": status, "env": env, "log": log}


def workdir(path: str) -> dict[str, Any]:
    """Every deployment under a workdir (directories that have a runs/ dir), each with its current run only."""
    try:
        names = sorted(n for n in os.listdir(path) if not n.startswith(".")
                       and os.path.isdir(os.path.join(path, n)) and os.path.exists(os.path.join(path, n, "runs")))
    except OSError:
        names = []
    return {"workdir": path, "deployments": {n: deployment(os.path.join(path, n), 0, None, False) for n in names}}


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
        elif word in ("--runs", "--log-tail"):
            if not rest:
                raise SuperviseError(f"{word} needs a value", EXIT_BAD_INPUT)
            opts[word[2:]] = rest.pop(0)
        elif word.startswith("--"):
            raise SuperviseError(f"unknown option {word}", EXIT_BAD_INPUT)
        else:
            pos.append(word)
    if len(pos) != 1:
        raise SuperviseError("usage: snapshot DIR [--runs N|all] [--log-tail BYTES] [--previous] [--workdir]",
                             EXIT_BAD_INPUT)
    return pos[0], opts, flags


def snapshot(argv: list[str]) -> dict[str, Any]:
    path, opts, flags = _parse(argv)
    root = os.path.abspath(os.path.expanduser(path))  # `~/x` arrives unexpanded: the target's home, no extra trip
    if "workdir" in flags:
        return workdir(root)
    runs = _count(opts, "runs") if "runs" in opts else 0
    return deployment(root, runs, _count(opts, "log-tail") if "log-tail" in opts else None, "previous" in flags)


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
