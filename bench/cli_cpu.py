"""CPU seconds of the commands the test suite (and an on-call shift) runs most, this tree against another.

    git archive REV deployer | tar -x -C /tmp/before
    .venv/bin/python bench/cli_cpu.py --compare /tmp/before --reps 7

Each figure is the CPU time (user + system, the command and every child it waited for: the target-side helper
of a `local` target included) of one command, the median of `--reps` runs, the two trees' runs interleaved so
that the machine's drift hits both; the ratio is this tree's over the other's. CPU, not wall time: `make test`
on a 2-core machine is CPU-bound (issue 33: ~1,400 `deploy` processes, ~0.75 CPU-s each, two thirds of the
suite's CPU), so CPU is what its time follows. The commands reach only `local` (this machine, a helper started
under a throwaway HOME and XDG_CACHE_HOME) and profile files of the repository: no sshd, no engine.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROFILE = str(REPO / "profiles" / "qwen36-mtp.yaml")
COMMANDS = {
    "deploy up --help": ["up", "--help"],
    "deploy status NAME --host local (absent)": ["status", "nosuch", "--host", "local"],
    "deploy down NAME --host local (absent)": ["down", "nosuch", "--host", "local"],
    "deploy render PROFILE": ["render", PROFILE],
    "deploy validate PROFILE": ["validate", PROFILE],
}
# The tree's deployer first on sys.path: ahead of the editable install's finder, which names this tree.
RUN = "import sys; sys.path.insert(0, sys.argv.pop(1)); from deployer.cli.main import main; main(sys.argv[1:])"


def cpu_of(argv: list[str], env: dict[str, str]) -> float:
    """CPU seconds of one run (it and the children it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(trees: dict[str, Path], reps: int, home: Path) -> dict[str, dict[str, list[float]]]:
    env = dict(os.environ, HOME=str(home), XDG_CACHE_HOME=str(home / "cache"), DEPLOYER_HOME=str(home / "dh"),
               DEPLOYER_CONFIG=str(home / "none.yaml"))
    got: dict[str, dict[str, list[float]]] = {tree: {name: [] for name in COMMANDS} for tree in trees}
    for rep in range(reps + 1):                    # the first round warms .pyc files and the helper's cache
        for name, words in COMMANDS.items():
            for tree, root in trees.items():
                seconds = cpu_of([sys.executable, "-c", RUN, str(root), *words], env)
                if rep:
                    got[tree][name].append(seconds)
    return got


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", type=Path, required=True, metavar="DIR",
                        help="another tree's root (holding deployer/), e.g. a `git archive` of the base revision")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    if not (args.compare / "deployer" / "__init__.py").is_file():
        print(f"bench/cli_cpu.py: {args.compare} holds no deployer/ package", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="cli-cpu-") as tmp:
        got = measure({"this": REPO, "other": args.compare}, args.reps, Path(tmp))
    print(f"{'command':<44} {'this s':>7} {'other s':>8} {'ratio':>6}   (CPU, median of {args.reps})")
    total = {"this": 0.0, "other": 0.0}
    for name in COMMANDS:
        this, other = (statistics.median(got[tree][name]) for tree in ("this", "other"))
        total["this"], total["other"] = total["this"] + this, total["other"] + other
        print(f"{name:<44} {this:7.3f} {other:8.3f} {this / other:6.2f}")
    print(f"{'all of them':<44} {total['this']:7.3f} {total['other']:8.3f} {total['this'] / total['other']:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
