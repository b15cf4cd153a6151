"""Interrupts of a two-node group's replace, over real sshd hosts (issue 22 finding 5 for multi-node groups):
Ctrl-C during the stop starts the stopped version again on every node before deployer leaves; after kill -9 every
node's repair guard does it, with no further command."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent / "faults"))

from deploy_helpers import deploy  # noqa: E402
from faultbed import start_deploy, wait_for_event  # noqa: E402
from hostbed import HostBed  # noqa: E402
from test_nodes_up import bed, nodes_profile  # noqa: E402,F401 (the two-host bed fixture)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
STOPPING = "to replace it"


def two_versions(tmp_path: Path, bed: HostBed) -> tuple[Path, Path]:
    v1, _ = nodes_profile(tmp_path, bed, env={"STANDIN_DRAIN_S": "3"}, restart={"grace_s": 10})
    data = yaml.safe_load(v1.read_text())
    data["engine"]["env"].update(STANDIN_MODE="slow", STANDIN_STEP_S="0.5", VERSION="2")
    v2 = tmp_path / "v2.yaml"
    v2.write_text(yaml.safe_dump(data, sort_keys=False))
    return v1, v2


def currents(bed: HostBed, name: str = "two-node") -> list[Path]:
    return [(h.workdir / name / "current").resolve() for h in bed.hosts]


def group_status(prof: Path, home: Path) -> tuple[int, list[dict[str, Any]]]:
    out = deploy("status", str(prof), "--json", home=home)
    assert "Traceback" not in out.stderr, out.stderr
    data = json.loads(out.stdout)
    return out.returncode, data["members"]


def test_ctrl_c_during_the_stop_of_a_group_replace_starts_the_old_version_on_every_node(
        tmp_path: Path, bed: HostBed) -> None:
    home = tmp_path / "home"
    v1, v2 = two_versions(tmp_path, bed)
    assert deploy("up", str(v1), home=home, timeout=150).returncode == 0
    old = currents(bed)
    up = start_deploy("up", str(v2), "--json", home=home)
    try:
        wait_for_event(up, STOPPING, timeout=60)
        time.sleep(0.5)  # inside the stop (rank 0 drains for 3 s)
        up.send_signal(signal.SIGINT)
        out, err = up.communicate(timeout=90)
    finally:
        if up.poll() is None:
            up.kill()
    text = out.decode() + err.decode()
    assert up.returncode == 130 and "Traceback" not in text, text[-3000:]
    assert "started the previous version" in text and "on every node" in text, text[-3000:]
    assert currents(bed) == old
    deadline = time.monotonic() + 60
    code, rows = group_status(v1, home)
    while code != 0 and time.monotonic() < deadline:
        time.sleep(1)
        code, rows = group_status(v1, home)
    assert code == 0, rows
    assert deploy("down", str(v1), home=home).returncode == 0


def test_kill_9_during_the_stop_of_a_group_replace_every_node_starts_the_old_version_by_itself(
        tmp_path: Path, bed: HostBed) -> None:
    """No further command but reads: each node's guard sees the client gone and starts its rank of v1 again; the
    group serves as a whole within stop + load + 10 s, and each node's lock history says it was repaired."""
    home = tmp_path / "home"
    v1, v2 = two_versions(tmp_path, bed)
    began = time.monotonic()
    assert deploy("up", str(v1), home=home, timeout=150).returncode == 0
    load_s = time.monotonic() - began  # v1's whole first up: more than the group's load
    old = currents(bed)
    up = start_deploy("up", str(v2), "--json", home=home)
    try:
        wait_for_event(up, STOPPING, timeout=60)
        deadline = time.monotonic() + 10
        while not all((h.workdir / "two-node" / "replace-intent.json").exists() for h in bed.hosts) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all((h.workdir / "two-node" / "replace-intent.json").exists() for h in bed.hosts), "no guard armed"
        time.sleep(0.5)  # inside the stop (rank 0 drains for 3 s)
        killed = time.monotonic()
        up.send_signal(signal.SIGKILL)
        up.communicate(timeout=10)
    finally:
        if up.poll() is None:
            up.kill()
    bound = 3 + load_s + 10
    code, rows = group_status(v1, home)
    # exit 0 comes as soon as rank 0 answers /health ("running"); its supervisor says "ready" once it saw the line
    while not (code == 0 and all(r["status"] == "ready" for r in rows)) and time.monotonic() < killed + bound:
        time.sleep(0.5)
        code, rows = group_status(v1, home)
    assert code == 0 and all(r["status"] == "ready" for r in rows), (code, rows, time.monotonic() - killed)
    assert currents(bed) == old
    for host in bed.hosts:
        events = (host.workdir / "two-node" / "lock-events.jsonl").read_text()
        assert '"event": "repaired"' in events and "started the previous version" in events, events
        assert not (host.workdir / "two-node" / "replace-intent.json").exists()
    assert deploy("down", str(v1), home=home).returncode == 0
