"""CLI start: `deploy --help` and `deploy validate` wall time (imports are lazy) against `python -c pass`."""

from __future__ import annotations

import sys
from pathlib import Path

from common import DEPLOY, REPO, Figure, deploy_env, median, timed


def _once(argv: list[str], home: Path) -> float:
    return timed(argv, env=deploy_env(home, HF_TOKEN="bench-not-a-token"))[0]


def run(tmp: Path, reps: int) -> list[Figure]:
    python = str(Path(sys.executable))
    home = tmp / "home-cli"
    runs = {
        "pass": [python, "-c", "pass"],
        "help": [DEPLOY, "--help"],
        "validate": [DEPLOY, "validate", str(REPO / "profiles" / "qwen36-mtp.yaml")],
    }
    for argv in runs.values():
        _once(argv, home)                                       # warm the page cache and .pyc files
    got: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(reps):                                       # interleaved, so drift hits all three
        for name, argv in runs.items():
            got[name].append(_once(argv, home))
    base = median(got["pass"])
    help_fig = Figure("deploy --help", median(got["help"]), "s", base, "python -c pass", "<= 0.25 s",
                      samples=got["help"], baseline_samples=got["pass"])
    help_fig.ok = help_fig.value <= 0.25
    validate_fig = Figure("deploy validate", median(got["validate"]), "s", base, "python -c pass", "",
                          samples=got["validate"], baseline_samples=got["pass"])
    return [help_fig, validate_fig]
