"""deployer/prepare/environment.py against a scripted target (its two callables): what runs in which order, that
nothing is built when the host cannot run what would be installed, a failed build said in one line from pip's
real output (tests/cases/install/), and a reuse that resolves nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deployer.errors import PreflightFailed, TargetError
from deployer.events import Event, PhaseEntered
from deployer.prepare.compat import Demand
from deployer.prepare.environment import Ran, EnvHost, prepare_environment
from deployer.prepare.envspec import EnvSpec
from deployer.profile.model import EngineInstall

CASES = Path(__file__).resolve().parents[1] / "cases" / "install"
INSTALL = EngineInstall(packages=["torch==2.8.0"])
SMI_OLD = "| NVIDIA-SMI 470.57.02    Driver Version: 470.57.02    CUDA Version: 11.4     |\n"
REPORT = json.dumps({"version": "1", "install": [
    {"metadata": {"name": "torch", "version": "2.8.0+cu128"},
     "download_info": {"url": "file:///w/torch-2.8.0+cu128-cp311-cp311-manylinux_2_28_x86_64.whl"}}]})


class Scripted:
    """Answers shell commands by the first matching word; records them and the helper requests."""

    def __init__(self, answers: dict[str, Ran], build: dict[str, Any] | None = None,
                 published: str | None = None) -> None:
        self.answers, self.build, self.published = answers, build, published
        self.commands: list[str] = []
        self.calls: list[dict[str, Any]] = []

    def shell(self, cmd: str, timeout: float, stdin: bytes | None) -> Ran:
        self.commands.append(cmd)
        for word, ran in self.answers.items():
            if word in cmd:
                return ran
        return Ran(127, "", "not scripted")

    def call(self, op: str, fields: dict[str, Any], wait_s: float, what: str) -> dict[str, Any]:
        self.calls.append({"op": op, **fields})
        if fields.get("reuse_only"):
            return {"reused": self.published is not None, "record": self.published}
        assert self.build is not None, "nothing should be built"
        return self.build

    def target(self) -> EnvHost:
        return EnvHost(shell=self.shell, call=self.call, workdir="/srv/w", label="gpu-box")


def tools(smi: str = "", report: str = REPORT) -> dict[str, Ran]:
    return {"sys.version_info": Ran(0, "3.11.2\n", ""), "pip --version": Ran(0, "pip 23.0.1 from /x (python 3.11)", ""),
            "config list": Ran(0, "", ""), "uv --version": Ran(1, "", ""),
            "--dry-run": Ran(0, report, ""), "urllib": Ran(0, "[2000000000]", ""),
            "--query-gpu": Ran(0, "0, NVIDIA A100-SXM4-80GB, 8.0\n", ""),
            "nvidia-smi": Ran(0, smi, "") if smi else Ran(127, "", "nvidia-smi: not found"),
            "/dev/shm": Ran(0, "Filesystem 1-blocks Used Available Capacity Mounted\nshm 1 0 68719476736 0% /dev/shm\n", ""),
            "df -PB1": Ran(0, "Filesystem 1-blocks Used Available Capacity Mounted\n/dev/x 1 0 999999999999 0% /\n", "")}


def test_a_driver_too_old_for_the_resolved_torch_refuses_before_anything_is_built() -> None:
    target = Scripted(tools(smi=SMI_OLD))
    with pytest.raises(PreflightFailed) as caught:
        prepare_environment(target.target(), INSTALL, Demand(engine_kind="sglang"), lambda e: None)
    assert any("torch 2.8.0+cu128 needs CUDA 12.8" in p and "supports CUDA 11.4" in p for p in caught.value.problems)
    assert [c["op"] for c in target.calls] == ["env_build"] and target.calls[0]["reuse_only"]   # only the look


def test_a_version_that_does_not_exist_is_one_line_from_pips_own_error() -> None:
    answers = tools()
    answers["--dry-run"] = Ran(1, "", (CASES / "pip-no-such-version.txt").read_text())
    target = Scripted(answers)
    with pytest.raises(TargetError) as caught:
        prepare_environment(target.target(), INSTALL, Demand(engine_kind="sglang"), lambda e: None)
    assert "\n" not in str(caught.value) and "no such version" in str(caught.value) and "gpu-box" in str(caught.value)


def test_a_failed_build_is_diagnosed_and_a_good_one_recorded() -> None:
    failed = {"reused": False, "record": None, "failed": "install", "exit_code": 1, "timed_out": False,
              "output": (CASES / "pip-disk-full.txt").read_text(), "steps": []}
    target = Scripted(tools(), build=failed)
    seen: list[Event] = []
    with pytest.raises(TargetError, match="disk filled up"):
        prepare_environment(target.target(), INSTALL, Demand(engine_kind="sglang"), seen.append)
    assert [e.phase for e in seen if isinstance(e, PhaseEntered)] == ["installing", "installing"]
    build = target.calls[-1]
    assert [s["name"] for s in build["steps"]] == ["venv", "install", "freeze"]
    assert build["root"] == "/srv/w/.deployer/envs" and build["digest"] == EnvSpec.from_install(INSTALL).digest
    assert build["record"]["resolved_hint"][0]["size"] == 2000000000


def test_a_published_environment_is_reused_without_resolving() -> None:
    spec = EnvSpec.from_install(INSTALL)
    record = json.dumps({"digest": spec.digest, "spec": spec.as_dict(), "built_at": "2026-12-02T10:00:00Z",
                         "tool": "pip 23.0.1", "python_version": "3.11.2",
                         "resolved": [{"name": "torch", "version": "2.8.0", "url": None, "size": None}]})
    target = Scripted(tools(), published=record)
    done = prepare_environment(target.target(), INSTALL, Demand(engine_kind="sglang"), lambda e: None)
    assert done.reused and not done.built and done.python == f"/srv/w/.deployer/envs/{spec.digest}/bin/python"
    assert not any("--dry-run" in c for c in target.commands)


class WithStdin(Scripted):
    """Scripted, and what each command got on its stdin."""

    def __init__(self, answers: dict[str, Ran], build: dict[str, Any] | None = None) -> None:
        super().__init__(answers, build)
        self.stdin: dict[str, bytes | None] = {}

    def shell(self, cmd: str, timeout: float, stdin: bytes | None) -> Ran:
        self.stdin[cmd] = stdin
        return super().shell(cmd, timeout, stdin)


NO_PIP = Ran(1, "", "No module named pip")


def uv_without_pip(compile_out: Ran, pip: Ran = NO_PIP) -> dict[str, Ran]:
    """A build python with no pip at all (a venv made --without-pip), or `pip`, uv on PATH, python3's pip for the
    configuration."""
    answers = tools(smi=SMI_OLD)
    answers = {"uv pip compile": compile_out, "-m pip --version": pip,
               "python3 -m pip config list": Ran(0, "global.find-links='/opt/wheels'\n", ""), **answers}
    if pip is not NO_PIP:  # a pip of its own reads the configuration
        answers["config list"] = answers["python3 -m pip config list"]
    answers["uv --version"] = Ran(0, "/usr/local/bin/uv\nuv 0.13.8 (x86_64-unknown-linux-gnu)\n", "")
    return answers


@pytest.mark.parametrize("pip", [NO_PIP, Ran(0, "pip 20.0.2 from /usr/lib/python3/dist-packages/pip (python 3.8)", "")],
                         ids=["no-pip", "pip-20.0.2"])
def test_uv_resolves_a_python_whose_pip_cannot_before_anything_is_built(pip: Ran) -> None:
    """The compatibility preflight is not skipped when the build python has no pip, or one older than 22.2 (no
    --report): uv resolves the spec (`uv pip compile`, the packages on its stdin) and the torch it would install
    is checked against the driver."""
    install = EngineInstall(packages=["torch==2.8.0+cu128"], python="/opt/nopip/bin/python")
    target = WithStdin(uv_without_pip(Ran(0, "torch==2.8.0+cu128\n", ""), pip))
    with pytest.raises(PreflightFailed) as caught:
        prepare_environment(target.target(), install, Demand(engine_kind="sglang"), lambda e: None)
    assert any("torch 2.8.0+cu128 needs CUDA 12.8" in p for p in caught.value.problems), caught.value.problems
    (compiled,) = [c for c in target.commands if "uv pip compile" in c]
    assert "--python /opt/nopip/bin/python" in compiled and compiled.endswith(" -")
    assert "--find-links /opt/wheels" in compiled            # the target's pip configuration, given to uv
    assert target.stdin[compiled] == b"torch==2.8.0+cu128\n"
    assert not any("--dry-run" in c for c in target.commands)
    assert [c["op"] for c in target.calls] == ["env_build"] and target.calls[0]["reuse_only"]   # nothing built


def test_uvs_resolution_failure_is_one_line() -> None:
    target = WithStdin(uv_without_pip(Ran(1, "", (CASES / "uv-no-such-version.txt").read_text())))
    with pytest.raises(TargetError) as caught:
        prepare_environment(target.target(), INSTALL, Demand(engine_kind="sglang"), lambda e: None)
    assert "\n" not in str(caught.value) and "cannot be resolved" in str(caught.value), str(caught.value)


def test_pip_resolving_for_a_uv_build_gets_pips_flags_not_uvs() -> None:
    """uv builds, pip (>= 22.2) resolves: pip reads its configuration itself and never gets uv's own flags
    (--index-strategy would make pip exit 2 with `no such option`)."""
    answers = tools()
    answers["config list"] = Ran(0, "global.find-links='/opt/wheels'\nglobal.extra-index-url='file:///opt/pypi'\n", "")
    answers["pip --version"] = Ran(0, "pip 23.2.1 from /x (python 3.11)", "")
    answers["uv --version"] = Ran(0, "/usr/local/bin/uv\nuv 0.13.8\n", "")
    target = Scripted(answers)
    done = prepare_environment(target.target(), INSTALL, Demand(engine_kind="sglang"), lambda e: None, build=False)
    assert done.tool == "uv" and done.resolved and done.resolved[0].size == 2000000000
    (dry,) = [c for c in target.commands if "--dry-run" in c]
    assert "--index-strategy" not in dry and "--find-links" not in dry, dry
