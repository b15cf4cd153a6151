"""`router.install` end to end: a fleet on a bare box (one host of tests/hostbed.py, one stand-in replica) whose
router, the real smg, deployer installs itself from this machine's local package source (the wheelhouse
scripts/build-smg-venv.sh downloads beside SMG_VENV: smg and its dependencies, find_links and an empty index, no
network), shown by `plan`, built as an `installing` phase before anything starts, serving, reused by the next
`up`, by `restart` and by `prepare`; a spec that cannot resolve refused in one line with nothing started.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy_helpers import events
from fleet_helpers import SMG_VENV, chat, fleet_deploy, fleet_profile, get_json
from hostbed import HostBed, host_bed
from install_helpers import envs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

SMG_VERSION = "1.13.0"
WHEELHOUSE = SMG_VENV / "wheelhouse"


@pytest.fixture()
def bed(tmp_path: Path) -> Iterator[HostBed]:
    with host_bed(tmp_path / "hosts", 1) as hosts:
        yield hosts


def wheelhouse() -> Path:
    if not any(WHEELHOUSE.glob(f"smg-{SMG_VERSION}-*.whl")):
        pytest.fail(f"no smg wheels in {WHEELHOUSE}: run `make smg-venv` (README's `make test` builds it)")
    return WHEELHOUSE


def router_install_profile(tmp_path: Path, bed: HostBed, packages: list[str], name: str) -> tuple[Path, dict[str, Any]]:
    """The fleet of fleet_helpers with `router.install` instead of `router.python`."""
    path, data = fleet_profile(tmp_path, bed, name=name)
    empty_index = tmp_path / "empty-index"
    empty_index.mkdir(exist_ok=True)
    data["router"].pop("python")
    data["router"]["install"] = {"packages": packages, "find_links": [str(wheelhouse())],
                                 "index_url": empty_index.as_uri(), "python": "/usr/bin/python3"}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, data


def router_phases(stdout: str) -> list[str]:
    return [e["phase"] for e in events(stdout) if e["event"] == "phase" and e.get("member") == "router"]


@pytest.mark.slow("builds the router's environment on the box (7 wheels, 44 MB) before the fleet comes up")
def test_a_fleet_comes_up_behind_the_router_deployer_installed(tmp_path: Path, bed: HostBed) -> None:
    home, host = tmp_path / "home", bed.hosts[0]
    prof, data = router_install_profile(tmp_path, bed, [f"smg=={SMG_VERSION}"], "rfleet")

    plan = fleet_deploy(bed, "plan", str(prof), home=home, timeout=300)
    assert f"router ({host.alias}): environment" in plan.stdout and f"smg=={SMG_VERSION}" in plan.stdout and \
        "would be built" in plan.stdout, plan.stdout + plan.stderr
    assert envs(host.workdir) == {}  # plan builds nothing

    started = time.monotonic()
    up = fleet_deploy(bed, "up", str(prof), "--json", "--skip-preflight", home=home, timeout=400)
    first_up_s = time.monotonic() - started
    assert up.returncode == 0, up.stderr[-3000:] + up.stdout[-3000:]
    try:
        assert "installing" in router_phases(up.stdout), router_phases(up.stdout)
        report = events(up.stdout)[-1]
        assert report["status"] == "ready" and report["router"]["status"] == "ready", report
        (digest, build), = envs(host.workdir).items()
        env_dir = host.workdir / ".deployer" / "envs" / digest
        record = json.loads((env_dir / "deployer-env.json").read_text())
        assert {"name": "smg", "version": SMG_VERSION}.items() <= \
            next(d for d in record["resolved"] if d["name"] == "smg").items()
        launch = (Path(report["router"]["run_dir"]) / "launch.sh").read_text()
        # the router runs from the managed environment (smg through router_key.SHIM: its secrets from the env)
        assert f"exec {env_dir}/bin/python -c " in launch and "from smg.cli import main" in launch
        assert "' launch --host " in launch

        addr, port = host.addr, data["router"]["port"]
        code, ready = get_json(f"http://{addr}:{port}/readiness")
        assert code == 200 and ready["healthy_workers"] == 1, ready
        assert chat(addr, port)["choices"][0]["message"]["content"]

        inode = (env_dir.parent / build).stat().st_ino
        started = time.monotonic()
        again = fleet_deploy(bed, "up", str(prof), "--json", "--skip-preflight", home=home, timeout=300)
        second_up_s = time.monotonic() - started
        assert again.returncode == 0, again.stderr[-3000:] + again.stdout[-3000:]
        assert "installing" not in router_phases(again.stdout), router_phases(again.stdout)
        assert envs(host.workdir) == {digest: build} and (env_dir.parent / build).stat().st_ino == inode  # reused
        assert events(again.stdout)[-1]["router"]["action"] in ("reconciled", "unchanged")  # not restarted

        # restart (rolling) reuses it too: the router keeps running from the same environment
        started = time.monotonic()
        restart = fleet_deploy(bed, "restart", str(prof), "--json", home=home, timeout=300)
        restart_s = time.monotonic() - started
        assert restart.returncode == 0, restart.stderr[-3000:] + restart.stdout[-3000:]
        assert "installing" not in router_phases(restart.stdout)
        assert events(restart.stdout)[-1]["router"]["action"] == "reconciled", events(restart.stdout)[-1]

        prep = fleet_deploy(bed, "prepare", str(prof), "--json", home=home, timeout=300)
        assert prep.returncode == 0, prep.stderr[-3000:] + prep.stdout[-3000:]
        rows = {r["host"]: r for r in events(prep.stdout)[-1]["environments"]}
        assert rows[f"router ({host.alias})"]["reused"] is True and rows[f"router ({host.alias})"]["digest"] == digest

        # the fleet's record (written beside the router) reads back: on-call finds the fleet by name and host
        status = fleet_deploy(bed, "status", "rfleet", "--host", host.alias, "--workdir", str(host.workdir), "--json", home=tmp_path / "other-home")
        assert status.returncode == 0, status.stderr[-2000:]
        assert json.loads(status.stdout)["router"]["healthy"] is True
        print(f"router.install: first up {first_up_s:.1f}s (builds smg's environment), second up {second_up_s:.1f}s, "
              f"restart {restart_s:.1f}s")
    finally:
        fleet_deploy(bed, "down", str(prof), home=home)


def test_a_router_spec_that_cannot_resolve_is_refused_in_one_line(tmp_path: Path, bed: HostBed) -> None:
    home, host = tmp_path / "home", bed.hosts[0]
    prof, _ = router_install_profile(tmp_path, bed, ["smg==99.0"], "badrouter")
    up = fleet_deploy(bed, "up", str(prof), "--skip-preflight", home=home, timeout=300)
    assert up.returncode == 4 and "Traceback" not in up.stderr, up.stderr[-3000:]
    said = [line for line in up.stderr.splitlines() if line.startswith("error:")]
    assert len(said) == 1 and "smg==99.0" in said[0] and SMG_VERSION in said[0], up.stderr  # the versions there are
    assert "router.install" in up.stderr and "engine.install" not in up.stderr, up.stderr
    assert envs(host.workdir) == {} and list(host.workdir.glob("*/current")) == []   # nothing built, nothing started
    print(said[0])

    plan = fleet_deploy(bed, "plan", str(prof), home=home, timeout=300)
    said = [line for line in plan.stdout.splitlines() if line.startswith(f"router ({host.alias}): problem:")]
    assert plan.returncode != 0 and len(said) == 1 and "router.install.packages" in said[0], plan.stdout + plan.stderr

    both = yaml.safe_load(prof.read_text())
    both["router"]["python"] = "/usr/bin/python3"
    prof.write_text(yaml.safe_dump(both, sort_keys=False))
    refused = fleet_deploy(bed, "up", str(prof), home=home)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "router.python and router.install exclude each other" in refused.stderr, refused.stderr
