"""`status --host H`, `top --host H` and `ls --host H` look under every workdir the local history knows on H (plus
the default or --workdir) and say on stderr where they looked when they find nothing (issue 36)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from deploy_helpers import deploy, write_profile


def aliased(tmp_path: Path, sshd: Any, name: str, workdir: Path) -> Path:
    """A profile whose target is the bed's ssh alias, as a user's `host: gpu-box` (--host names it so)."""
    return write_profile(tmp_path, sshd, name=name, workdir=workdir, extra={"target": {"host": "deployer-test"}})


def test_host_wide_reads_find_a_deployment_under_a_non_default_workdir(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "h"
    elsewhere = tmp_path / "elsewhere"
    prof = aliased(tmp_path, sshd, "farwork", elsewhere)
    env = {"DEPLOYER_SSH_CONFIG": str(sshd.ssh_config)}
    up = deploy("up", str(prof), "--skip-preflight", home=home, env=env)
    assert up.returncode == 0, up.stderr
    try:
        status = deploy("status", "--host", "deployer-test", "--json", home=home, env=env)
        assert status.returncode == 0, (status.stdout, status.stderr)
        assert [row["name"] for row in json.loads(status.stdout)] == ["farwork"]
        top = deploy("top", "--host", "deployer-test", "--once", "--json", home=home, env=env)
        assert top.returncode == 0, (top.stdout, top.stderr)
        assert [row["deployment"] for row in json.loads(top.stdout)["rows"]] == ["farwork"]
        ls = deploy("ls", "--host", "deployer-test", "--json", home=home, env=env)
        assert ls.returncode == 0, ls.stderr
        rows = json.loads(ls.stdout)
        assert [(r["name"], r["workdir"], r["state"]) for r in rows] == [("farwork", str(elsewhere), "ready")]
        assert isinstance(rows[0]["at"], float)  # WHEN from the local history
    finally:
        assert deploy("down", str(prof), home=home, env=env).returncode == 0


def test_host_wide_reads_that_find_nothing_name_the_workdirs_they_searched(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "h"
    elsewhere = tmp_path / "elsewhere"
    prof = aliased(tmp_path, sshd, "gone", elsewhere)
    env = {"DEPLOYER_SSH_CONFIG": str(sshd.ssh_config)}
    assert deploy("up", str(prof), "--skip-preflight", home=home, env=env).returncode == 0
    assert deploy("down", str(prof), home=home, env=env).returncode == 0
    shutil.rmtree(elsewhere / "gone")  # the local history still knows the workdir; nothing is deployed there now
    given = tmp_path / "given"
    for argv in (["status"], ["top", "--once"], ["ls"]):
        out = deploy(*argv, "--host", "deployer-test", "--workdir", str(given), home=home, env=env)
        lines = [line for line in out.stderr.splitlines() if "no deployments on deployer-test" in line]
        assert len(lines) == 1, (argv, out.stderr)
        assert str(given) in lines[0] and str(elsewhere) in lines[0], lines
        assert out.returncode == (0 if argv == ["ls"] else 7), (argv, out.returncode, out.stderr)
