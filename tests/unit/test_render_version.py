"""`deploy render` (issue 24) shows the flags `up` will run for the target's engine version when this machine
knows that version (engine.version, or the last preflight against the target), and says plainly when it does not
and which version it assumed. The seed profile (written for the `--mamba-scheduler-strategy` era) is the case."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from deployer.preflight.flags import Flag, FlagSet, save_flagset
from deployer.preflight.known import record_target_version
from deployer.profile.loader import load_profile

REPO = Path(__file__).resolve().parents[2]
SEED = "profiles/qwen36-mtp.yaml"
OLD, NEW = "--mamba-scheduler-strategy extra_buffer", "--mamba-radix-cache-strategy extra_buffer"


def render(home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deployer.cli", "render", SEED, *argv], capture_output=True,
                          text=True, timeout=60, cwd=str(REPO),
                          env={"PATH": os.environ["PATH"], "DEPLOYER_HOME": str(home)})


def notes(out: subprocess.CompletedProcess[str]) -> list[str]:
    return [line[len("note: "):] for line in out.stderr.splitlines() if line.startswith("note: ")]


def seed_table(version: str, *, without: str = "") -> FlagSet:
    """A flag table with every flag the seed renders to (under the 0.5.23 names), less `without`."""
    names = ["--model-path", "--host", "--port", "--tp-size", "--trust-remote-code", "--speculative-algorithm",
             "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens",
             "--mamba-radix-cache-strategy", "--max-running-requests", "--context-length"]
    return FlagSet("sglang", version, tuple(Flag((n,), n[2:].replace("-", "_"), takes_value=n != "--trust-remote-code")
                                            for n in names if n != without))


def test_no_known_version_shows_the_flags_as_written_and_says_so(tmp_path: Path) -> None:
    out = render(tmp_path / "home")
    assert out.returncode == 0, out.stderr
    assert OLD in out.stdout and NEW not in out.stdout
    assert notes(out)[0].startswith("flags as written, not translated: the sglang version on gpu-box is not known "
                                    "here (no engine.version, no preflight against it yet)")


def test_the_pinned_version_renders_what_up_runs_there(tmp_path: Path) -> None:
    out = render(tmp_path / "home", "--set", "engine.version=0.5.23")
    assert out.returncode == 0, out.stderr
    assert NEW in out.stdout and OLD not in out.stdout
    said = notes(out)
    assert said[0].startswith("flags as `up` runs them on sglang 0.5.23 (engine.version pins it")
    assert any("renamed --mamba-radix-cache-strategy in sglang 0.5.14" in n for n in said)
    old = render(tmp_path / "home", "--set", "engine.version=0.5.10")
    assert OLD in old.stdout and "on sglang 0.5.10 (engine.version pins it" in old.stderr
    data = json.loads(render(tmp_path / "home", "--set", "engine.version=0.5.23", "--json").stdout)
    assert "--mamba-radix-cache-strategy" in data["argv"]
    assert data["engine_version"]["version"] == "0.5.23" and data["engine_version"]["known"] is True


def test_the_version_the_last_preflight_found_is_used_for_that_target_only(tmp_path: Path) -> None:
    home = tmp_path / "home"
    record_target_version(home / "cache", load_profile(REPO / SEED, allow_unset=True), "0.5.23")
    out = render(home)
    assert NEW in out.stdout and OLD not in out.stdout
    assert notes(out)[0].startswith("flags as `up` runs them on sglang 0.5.23 (the last preflight against gpu-box "
                                    "found it, 20")
    other = render(home, "--host", "other-box")
    assert OLD in other.stdout and "the sglang version on other-box is not known here" in other.stderr
    venv = render(home, "--set", "engine.python=/opt/other/bin/python")
    assert OLD in venv.stdout  # another engine python on the same box may hold another release


def test_without_a_known_version_the_newest_cached_table_is_an_assumption_said_as_one(tmp_path: Path) -> None:
    home = tmp_path / "home"
    save_flagset(home / "cache", seed_table("0.5.23"))
    out = render(home)
    assert out.returncode == 0 and NEW in out.stdout
    assert notes(out)[0] == ("flags translated for sglang 0.5.23, an assumption (the sglang version on gpu-box is "
                             "not known here (no engine.version, no preflight against it yet); assumed the newest "
                             "cached flag table); `up` translates them for the version the target has")


def test_what_up_would_refuse_is_said(tmp_path: Path) -> None:
    home = tmp_path / "home"
    save_flagset(home / "cache", seed_table("0.5.23", without="--speculative-eagle-topk"))
    out = render(home, "--set", "engine.version=0.5.23")
    assert out.returncode == 0, out.stderr
    assert any(n.startswith("`up` would refuse this before launch: ") and "--speculative-eagle-topk" in n
               for n in notes(out)), out.stderr
