"""Benchmarks of deployer on the SSH test bed; each figure against a baseline measured in the same command.

    .venv/bin/python bench/run.py [--reps N] [--only overhead,status,detection,cli,weights,real] [--rc-cost S] [--delay S]
                                  [--compare DIR]

Starts a throwaway sshd on 127.0.0.1 (tests/sshbed.py) whose login shell's .bashrc costs about --rc-cost
seconds per command (as conda/pyenv init do on a real GPU image; never skipped), and the stand-in engine;
measures `ssh host true` on it first and states that shell cost beside every SSH figure; prints a table, and
writes bench/results/latest.json. Exit 0 even when a target is missed (the table says MISS): these are measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cli_start  # noqa: E402
import detection  # noqa: E402
import oncall_status  # noqa: E402
import overhead  # noqa: E402
import real_engines  # noqa: E402
import shell_cost  # noqa: E402
import weights_downtime  # noqa: E402
from common import REPO, Figure, use_link  # noqa: E402
from sshbed import make_sshd  # noqa: E402

RESULTS = REPO / "bench" / "results" / "latest.json"
SECTIONS = ("overhead", "status", "detection", "cli", "weights")
OPTIONAL = ("real",)  # real engines (make real-engines; minutes): only when asked for with --only
RC_COST_S = 0.15  # conda init on a GPU image: ~120-230 ms (/work/shared/ssh-notes.md)


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="repetitions per measurement (median reported)")
    parser.add_argument("--rc-cost", type=float, default=RC_COST_S,
                        help="seconds the target's .bashrc costs per command (default %(default)s)")
    parser.add_argument("--delay", type=float, default=0.0,
                        help="seconds added to each direction of every SSH connection (bench/link.py; 0.025 = "
                             "50 ms round trips), for the OpenSSH baselines and deployer alike (default: none)")
    parser.add_argument("--compare", type=Path, default=None, metavar="DIR",
                        help="also time `deploy status` of the code in DIR (its deployer/ package: `git archive REV "
                             "deployer | tar -x -C DIR`) in the same rounds, against the same baseline")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS + OPTIONAL}")
    return parser.parse_args(argv)


def _fmt(value: float | None, unit: str) -> str:
    if value is None or value != value:
        return "-"
    return f"{value * 1000:.0f} ms" if unit == "s" and value < 1 else f"{value:.2f} {unit}"


def table(figures: list[Figure]) -> str:
    rows = [("benchmark", "value", "baseline", "ratio", "target", "", "shell cost")]
    for f in figures:
        verdict = "" if f.ok is None else ("ok" if f.ok else "MISS")
        shell = "local" if f.shell_cost_s is None else f"ssh true {f.shell_cost_s * 1000:.0f} ms"
        rows.append((f.name, _fmt(f.value, f.unit), _fmt(f.baseline, f.unit),
                     "-" if f.ratio is None else f"{f.ratio:.2f}x", f.target or "-", verdict, shell))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    notes = [f"  {f.name}: {f.notes}" for f in figures if f.notes]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:], *(["notes:", *notes] if notes else [])])


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    tmp = Path(tempfile.mkdtemp(prefix="deployer-bench-", dir="/tmp"))
    started = time.monotonic()
    figures: list[Figure] = []
    try:
        if "cli" in only:
            figures += cli_start.run(tmp, max(args.reps, 10))
        if only & {"overhead", "status", "detection", "real", "weights"}:
            bed = make_sshd(tmp / "sshd", rc_cost=args.rc_cost)
            use_link(args.delay, tmp, bed.host)
            try:
                shell = shell_cost.run(bed, tmp, args.reps)
                over_ssh = [shell]
                if "overhead" in only:
                    over_ssh += overhead.run(bed, tmp, args.reps)
                if "status" in only:
                    over_ssh += oncall_status.run(bed, tmp, args.reps, args.compare)
                if "detection" in only:
                    over_ssh += detection.run(bed, tmp, args.reps)
                if "weights" in only:
                    over_ssh += weights_downtime.run(bed, tmp, args.reps)
                if "real" in only:
                    over_ssh += real_engines.run(bed, tmp, args.reps)
            finally:
                bed.stop()
            for fig in over_ssh:
                fig.shell_cost_s = shell.value
            figures += over_ssh
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    took = time.monotonic() - started
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "took_s": round(took, 1),
                                   "machine": {"python": platform.python_version(), "platform": platform.platform(),
                                               "cpus": os.cpu_count()},
                                   "reps": args.reps, "rc_cost_s": args.rc_cost, "link_delay_s": args.delay,
                                   "figures": [f.to_json() for f in figures]}, indent=2) + "\n")
    print(table(figures))
    print(f"\n{len(figures)} figures in {took:.0f} s; written to {RESULTS.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
