"""Weights for a fleet (issue 25, item 3): every member's `up` fetches on its host at once, before anything of it
is stopped; members that share a host share one fetch (the target-side lock), so the hub sends the repo once per
host. The bed's hosts share this machine's disk (tests/hostbed.py), so here the repo is sent once in all."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from pathlib import Path

import pytest
import yaml
from standin.hubstub import HubStub, tiny_repo

from deploy_helpers import events
from fleet_helpers import fleet_deploy, fleet_profile
from hostbed import HostBed, host_bed
from sshbed import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture()
def bed(tmp_path: Path) -> Iterator[HostBed]:
    with host_bed(tmp_path / "hosts", 2) as hosts:
        yield hosts


def hub_fleet(tmp_path: Path, bed: HostBed, hub: HubStub, name: str) -> Path:
    """Three replicas of acme/tiny with `engine.weights` on two hosts (two on the first, in workdirs of their own)."""
    h0, h1 = bed.hosts
    replicas = [{"host": h0.alias, "workdir": str(h0.workdir / "a"), "engine_port": free_port(h0.addr)},
                {"host": h0.alias, "workdir": str(h0.workdir / "b"), "engine_port": free_port(h0.addr)},
                {"host": h1.alias, "workdir": str(h1.workdir), "engine_port": free_port(h1.addr)}]
    prof, data = fleet_profile(tmp_path, bed, name=name, router=False, replicas=replicas,
                               env={"HF_HOME": str(tmp_path / "hf")})
    data["engine"]["model_path"] = "acme/tiny"
    data["engine"]["weights"] = {"endpoint": hub.endpoint}
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    return prof


def hub_nodes(tmp_path: Path, bed: HostBed, hub: HubStub, name: str) -> Path:
    """A two-node group of acme/tiny with `engine.weights`, each node a GPU box (the stand-in nvidia-smi)."""
    from test_nodes_up import STANDIN_BIN, nodes_profile

    for host in bed.hosts:
        if not (host.sshd.bin_dir / "nvidia-smi").exists():
            (host.sshd.bin_dir / "nvidia-smi").symlink_to(STANDIN_BIN / "nvidia-smi")
    prof, _ = nodes_profile(tmp_path, bed, name=name, env={"HF_HOME": str(tmp_path / "hf")})
    data = yaml.safe_load(prof.read_text())
    data["engine"]["model_path"] = "acme/tiny"
    data["engine"]["weights"] = {"endpoint": hub.endpoint}
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    return prof


def test_a_fleet_fetches_at_once_and_once_per_host(tmp_path: Path, bed: HostBed) -> None:
    repo = tiny_repo("acme/tiny", 2_000_000)
    with HubStub(repo) as hub:
        hub.rate = 2_000_000
        prof = hub_fleet(tmp_path, bed, hub, "wfleet")
        home = tmp_path / "home"
        made = fleet_deploy(bed, "up", str(prof), "--skip-preflight", "--json", home=home)
        try:
            assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
            seen = events(made.stdout)
            began = [e for e in seen if e.get("event") == "phase" and e.get("phase") == "fetching weights"]
            done = [e for e in seen if e.get("event") == "info" and str(e.get("message", "")).startswith("weights ")]
            assert len(began) == 3 and len(done) == 3, [e for e in seen if e.get("event") in ("phase", "info")]
            first = {host: min(e["at"] for e in began if e["host"] == host) for host in {e["host"] for e in began}}
            assert len(first) == 2 and max(first.values()) < min(e["at"] for e in done)  # the hosts at once
            assert sum(hub.served.values()) == repo.total  # one disk here: the repo came once
            later = [e["message"] for e in done if e["member"] == "r1"]  # node-0's second member: nothing left
            assert len(later) == 1 and "already on disk" in later[0], later

            v2 = tiny_repo("acme/tiny", 2_000_000, seed="v2")
            hub.publish(v2)
            served = dict(hub.served)
            rolled = fleet_deploy(bed, "up", str(prof), "--skip-preflight", "--json", home=home)
            assert rolled.returncode == 0, rolled.stdout[-3000:] + rolled.stderr[-3000:]
            seen = events(rolled.stdout)
            stops = [e["at"] for e in seen if "stopping the running version" in str(e.get("message", ""))]
            fetched = [e for e in seen if e.get("event") == "info" and v2.commit[:12] in str(e.get("message", ""))
                       and "fetched in" in str(e.get("message", ""))]
            assert len(stops) == 3 and fetched, [e.get("message") for e in seen if e.get("event") == "info"]
            assert max(e["at"] for e in fetched) < min(stops)  # the whole roll began after the new weights were in
            early = {e["host"] for e in seen if e.get("phase") == "fetching weights" and e["at"] < min(stops)}
            assert len(early) == 2  # both hosts fetched before the first replica was stopped
            new = sum(len(f.data) for f in v2.files if f.blob_id not in {g.blob_id for g in repo.files})
            assert new < v2.total  # the tokenizer did not change: its blob is on disk already
            assert sum(hub.served.values()) - sum(served.values()) == new  # the new blobs came once
        finally:
            fleet_deploy(bed, "down", str(prof), home=home)


def test_a_node_group_fetches_on_every_node_before_it_starts(tmp_path: Path, bed: HostBed) -> None:
    repo = tiny_repo("acme/tiny", 500_000)
    with HubStub(repo) as hub:
        prof = hub_nodes(tmp_path, bed, hub, "wnodes")
        home = tmp_path / "home"
        made = fleet_deploy(bed, "up", str(prof), "--skip-preflight", "--json", home=home)
        try:
            assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
            seen = events(made.stdout)
            began = {e.get("node") for e in seen if e.get("event") == "phase" and e.get("phase") == "fetching weights"}
            assert began == {0, 1}, [e for e in seen if e.get("event") == "phase"]
            first_attempt = min(e["at"] for e in seen if e.get("event") == "attempt")
            fetched = [e["at"] for e in seen if e.get("event") == "info" and str(e.get("message")).startswith("weights")]
            assert len(fetched) == 2 and max(fetched) < first_attempt
        finally:
            fleet_deploy(bed, "down", str(prof), home=home)


ITSELF = "weights: the engine downloads acme/tiny itself as it starts"


def without_weights(prof: Path) -> Path:
    """`prof` without `engine.weights`, beside it: the engine downloads the hub repo itself as it starts."""
    data = yaml.safe_load(prof.read_text())
    del data["engine"]["weights"]
    itself = prof.with_name(prof.stem + "-itself.yaml")
    itself.write_text(yaml.safe_dump(data, sort_keys=False))
    return itself


def plan_document(stdout: str) -> Any:
    """The one JSON document `plan --json` printed (before the error envelope line of a failure)."""
    return json.JSONDecoder().raw_decode(stdout.lstrip())[0]


def test_a_fleet_plan_says_what_the_fetch_takes_on_every_host_once(tmp_path: Path, bed: HostBed) -> None:
    """Three replicas on two hosts: one `weights` line per host (text and --json), nothing fetched."""
    repo = tiny_repo("acme/tiny", 300_000)
    with HubStub(repo) as hub:
        h0, h1 = bed.hosts
        prof = hub_fleet(tmp_path, bed, hub, "wfplan")
        home = tmp_path / "home"
        text = fleet_deploy(bed, "plan", str(prof), home=home)
        assert "Traceback" not in text.stderr, text.stderr[-2000:]
        lines = [line for line in text.stdout.splitlines() if line.startswith(f"weights {repo.commit[:12]} on ")]
        assert len(lines) == 2 and all("(fits)" in line for line in lines), text.stdout[-3000:] + text.stderr[-3000:]
        assert any(f"@{h0.addr}:" in line for line in lines) and any(f"@{h1.addr}:" in line for line in lines), lines
        as_json = plan_document(fleet_deploy(bed, "plan", str(prof), "--json", home=home).stdout)
        hosts = as_json["weights_hosts"]
        assert [w["missing_bytes"] for w in hosts] == [repo.total, repo.total], hosts
        assert sorted(w["host"].split("@")[1].split(":")[0] for w in hosts) == sorted([h0.addr, h1.addr]), hosts
        assert as_json["weights"] == hosts[0] and hub.served == {}
        assert "itself as it starts" not in text.stdout, text.stdout
        # without engine.weights each replica's engine downloads the repo as it starts: said once per host
        plain = fleet_deploy(bed, "plan", str(without_weights(prof)), home=home)
        assert plain.stdout.count(ITSELF) == 2, plain.stdout[-3000:] + plain.stderr[-2000:]


def test_a_node_group_plan_says_what_the_fetch_takes_on_every_node(tmp_path: Path, bed: HostBed) -> None:
    repo = tiny_repo("acme/tiny", 300_000)
    with HubStub(repo) as hub:
        prof = hub_nodes(tmp_path, bed, hub, "wnplan")
        home = tmp_path / "home"
        text = fleet_deploy(bed, "plan", str(prof), home=home)
        assert text.returncode == 0 and "Traceback" not in text.stderr, text.stderr[-2000:]
        lines = [line for line in text.stdout.splitlines() if line.startswith(f"weights {repo.commit[:12]} on ")]
        assert len(lines) == 2, text.stdout[-3000:]
        as_json = plan_document(fleet_deploy(bed, "plan", str(prof), "--json", home=home).stdout)
        assert len(as_json["weights_hosts"]) == 2 and as_json["weights"]["commit"] == repo.commit, as_json
        hub.repos.clear()  # the hub no longer knows the repo: a problem line per node, nothing else breaks
        gone = fleet_deploy(bed, "plan", str(prof), home=home)
        assert gone.returncode == 4 and "Traceback" not in gone.stderr, gone.stderr[-2000:]  # a problem: unfit
        assert gone.stdout.count("problem: weights: fetching acme/tiny@main on") == 2, gone.stdout + gone.stderr
        assert "itself as it starts" not in text.stdout, text.stdout
        # without engine.weights every node's engine downloads the repo as it starts: said once for the group
        itself = without_weights(prof)
        plain = fleet_deploy(bed, "plan", str(itself), home=home)
        assert plain.returncode == 0 and plain.stdout.count(ITSELF) == 1, plain.stdout[-3000:] + plain.stderr[-2000:]


def pushing(tmp_path: Path, bed: HostBed, make: Any, name: str) -> Path:
    """`make`'s profile (hub_fleet, hub_nodes) with `engine.weights.push` of a small directory beside it instead."""
    folder = tmp_path / "models" / "ft"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"w" * 200_000)
    with HubStub(tiny_repo("acme/tiny", 1000)) as hub:
        prof: Path = make(tmp_path, bed, hub, name)
    data = yaml.safe_load(prof.read_text())
    data["engine"]["model_path"] = "models/ft"
    data["engine"]["weights"] = {"push": True}
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    return prof


def test_a_node_group_push_to_nodes_with_different_workdirs_is_refused_before_anything_starts(
        tmp_path: Path, bed: HostBed) -> None:
    """The group's engine has one model path: pushed into each node's own workdir, two places are one line (as an
    environment at two paths is), and nothing is launched."""
    prof = pushing(tmp_path, bed, hub_nodes, "wnpush")
    home = tmp_path / "home"
    made = fleet_deploy(bed, "up", str(prof), "--skip-preflight", home=home)
    try:
        assert made.returncode == 4 and "Traceback" not in made.stderr, made.stderr[-3000:]
        assert "is at different places on the hosts" in made.stderr and "same workdir" in made.stderr, made.stderr
        for host in bed.hosts:  # each node got the directory in its own workdir, and nothing started
            assert (host.workdir / ".deployer" / "models").is_dir()
            assert not list(host.workdir.glob("wnpush/current"))
    finally:
        fleet_deploy(bed, "down", str(prof), home=home)


def test_a_fleet_pushes_a_directory_to_every_replica_before_it_starts(tmp_path: Path, bed: HostBed) -> None:
    prof = pushing(tmp_path, bed, hub_fleet, "wfpush")
    home = tmp_path / "home"
    made = fleet_deploy(bed, "up", str(prof), "--skip-preflight", "--json", home=home)
    try:
        assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
        pushed = [e for e in events(made.stdout) if "pushed to" in str(e.get("message", ""))]
        assert {e["member"] for e in pushed} == {"r0", "r1", "r2"}, pushed
        for index, workdir in enumerate((bed.hosts[0].workdir / "a", bed.hosts[0].workdir / "b", bed.hosts[1].workdir)):
            log = (workdir / f"wfpush-r{index}" / "current" / "engine.log").read_text()
            assert f"standin: weights from {workdir / '.deployer' / 'models'}/" in log, log[-2000:]
    finally:
        fleet_deploy(bed, "down", str(prof), home=home)
