"""`deploy upgrade --apply` end to end (issue 39): real sshd, real supervisor, the stand-in SGLang of two eras as two
releases (STANDIN_SGLANG_VERSION 0.5.10 and 0.5.23, each behind its own engine python), real HTTP on the target.

A good release is promoted (its numbers within the gates of the old one's, measured just before the switch); a worse
one (the stand-in's latency knob STANDIN_CHAT_DELAY_S) is switched back automatically; each decision is an `upgrade`
event with both releases' numbers in the local history.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import deploy, upgrade_events, write_profile

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300),
              pytest.mark.slow("three deployments of the stand-in, two load checks each, one switch back")]

GATES = {"requests": 4, "max_tokens": 8, "slack_ms": 250, "ttft_ratio_max": 1.5}
SLOW_S = "1.0"   # the worse release's time per chat answer: far beyond slack and ratio


def python(tmp: Path, name: str, env: str) -> str:
    """A stand-in engine python of one release: /usr/bin/python3 with that release's env."""
    path = tmp / name
    path.write_text(f'#!/bin/sh\n{env} exec /usr/bin/python3 "$@"\n')
    path.chmod(0o755)
    return str(path)


def running_version(prof: Path, home: Path) -> str:
    status = deploy("status", str(prof), "--json", home=home)
    assert status.returncode == 0, status.stderr[-2000:]
    return str(json.loads(status.stdout).get("engine_version"))   # the release the running profile names


@pytest.fixture()
def serving_old(tmp_path: Path, sshd: Any) -> Any:
    """The stand-in 0.5.10 serving, from a profile with upgrade gates; stopped at the end."""
    old = python(tmp_path, "standin-0510", "STANDIN_SGLANG_VERSION=0.5.10")
    prof = write_profile(tmp_path, sshd, name="upg", args={"mamba_scheduler_strategy": "extra_buffer"},
                         extra={"engine": {"python": old, "version": "0.5.10"}, "upgrade": {"gates": GATES}})
    home = tmp_path / "home"
    up = deploy("up", str(prof), home=home)
    assert up.returncode == 0, up.stderr[-3000:]
    try:
        yield prof, home
    finally:
        deploy("down", str(prof), home=home)


def test_a_good_release_is_promoted_with_its_numbers_in_history(serving_old: Any, tmp_path: Path) -> None:
    prof, home = serving_old
    new = python(tmp_path, "standin-0523", "STANDIN_SGLANG_VERSION=0.5.23")
    ran = deploy("upgrade", str(prof), "--engine", "sglang==0.5.23", "--python", new, "--apply", "--json",
                 home=home, timeout=240)
    assert ran.returncode == 0, ran.stderr[-3000:]
    report = json.loads(ran.stdout.splitlines()[-1])
    assert report["apply"]["decision"] == "promoted", report["apply"]
    assert [c["name"] for c in report["changes"] if c["what"] == "renamed"] == ["mamba_scheduler_strategy"]
    assert running_version(prof, home) == "0.5.23"
    [event] = upgrade_events(home, "upg")
    assert (event["from"], event["to"], event["decision"]) == ("0.5.10", "0.5.23", "promoted")
    assert event["before"]["version"] == "0.5.10" and event["after"]["version"] == "0.5.23"
    assert event["before"]["ttft_ms"] > 0 and event["after"]["tokens_per_s"] > 0
    assert all(g["passed"] for g in event["gates"]) and len(event["gates"]) == 3


def test_a_worse_release_is_rolled_back_automatically_with_its_numbers_in_history(serving_old: Any,
                                                                                  tmp_path: Path) -> None:
    prof, home = serving_old
    slow = python(tmp_path, "standin-0523-slow", f"STANDIN_SGLANG_VERSION=0.5.23 STANDIN_CHAT_DELAY_S={SLOW_S}")
    ran = deploy("upgrade", str(prof), "--engine", "sglang==0.5.23", "--python", slow, "--apply", home=home,
                 timeout=240)
    assert ran.returncode == 6, (ran.returncode, ran.stderr[-3000:])
    assert ran.stderr.strip().splitlines()[-1].startswith("error: the upgrade to sglang==0.5.23 was rolled back: "
                                                          "gate ttft_ms")
    assert "apply: rolled back (gate ttft_ms" in ran.stdout and "ttft_ms: " in ran.stdout
    assert running_version(prof, home) == "0.5.10"       # the old release serves again
    [event] = upgrade_events(home, "upg")
    assert event["decision"] == "rolled back"
    ttft = next(g for g in event["gates"] if g["gate"] == "ttft_ms")
    assert not ttft["passed"] and ttft["new"] >= float(SLOW_S) * 1000 > ttft["limit"]
