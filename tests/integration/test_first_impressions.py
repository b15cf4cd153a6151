"""Issue 24 over the real sshd with the stand-in SGLang 0.5.23 and the stand-in nvidia-smi: a flag is never
silently dropped (refused before launch with exit 2, or respelt loudly when it is a typo of exactly one flag), GPU
indices and counts checked against the box before launch, `plan` of a running deployment, argparse's own words."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy_helpers import deploy, events, write_profile

pytestmark = pytest.mark.integration

REFUSED = "refused: deployer never drops a flag that is neither a documented rename nor a documented removal"


def gpus_env(tmp_path: Path, count: int) -> dict[str, str]:
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps({"gpus": [{"name": "NVIDIA H200", "memory_total": 143771, "memory_used": 1}] * count}))
    return {"STANDIN_GPUS_FILE": str(path)}


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def test_an_unknown_flag_is_refused_before_launch_exit_2(tmp_path: Path, sshd: Any) -> None:
    """It used to be dropped ("dropped --zzq-totally-unknown: this engine version does not have it") with exit 0."""
    prof = write_profile(tmp_path, sshd, name="zzq", args={"zzq_totally_unknown": 7})
    up = deploy("up", str(prof), home=tmp_path / "h")
    assert up.returncode == 2, up.stderr + up.stdout
    line = next(ln for ln in up.stderr.splitlines() if ln.startswith("error: "))
    assert line.startswith(f"error: {prof}:") and "engine.args.zzq_totally_unknown: unknown flag " \
        "--zzq-totally-unknown for sglang 0.5.23" in line and line.endswith(REFUSED)
    assert "Traceback" not in up.stderr and "dropped" not in up.stderr + up.stdout
    assert not (tmp_path / "work" / "zzq" / "runs").exists() or not list((tmp_path / "work" / "zzq" / "runs").iterdir())
    plan = deploy("plan", str(prof), home=tmp_path / "h")
    assert plan.returncode == 2 and last_line(plan.stderr) == line


def test_a_flag_close_to_several_is_refused_naming_them(tmp_path: Path, sshd: Any) -> None:
    """`disable_cuda_graphs` is close to three flags of 0.5.23: no guess between them, the message names them."""
    prof = write_profile(tmp_path, sshd, name="near", args={"disable_cuda_graphs": True})
    up = deploy("up", str(prof), "--json", home=tmp_path / "h")
    assert up.returncode == 2, up.stderr + up.stdout[-2000:]
    error = events(up.stdout)[-1]
    assert error["event"] == "error" and error["code"] == 2
    assert ("unknown flag --disable-cuda-graphs for sglang 0.5.23 (closest: --disable-cuda-graph, "
            "--disable-decode-cuda-graph, --disable-prefill-cuda-graph); " + REFUSED) in error["message"]


def test_a_typo_of_one_flag_is_respelt_loudly_and_saved(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="typo", args={"mem_fraction_statc": 0.85})
    fixed = tmp_path / "fixed.yaml"
    up = deploy("up", str(prof), "--json", "--save-fixed", str(fixed), home=tmp_path / "h")
    assert up.returncode == 0, up.stderr + up.stdout[-3000:]
    warnings = [e["message"] for e in events(up.stdout) if e["event"] == "warning"]
    assert ("unknown flag --mem-fraction-statc for sglang 0.5.23; did you mean --mem-fraction-static? respelt as "
            "--mem-fraction-static (the one close flag; --save-fixed writes it)") in warnings
    assert yaml.safe_load(fixed.read_text())["engine"]["args"] == {"mem_fraction_static": 0.85}
    strict = deploy("validate", str(prof), home=tmp_path / "h")   # the table `up` cached: validate is strict
    assert strict.returncode == 2
    assert (f"error: {prof}:") in strict.stderr and "did you mean --mem-fraction-static? (`up` would respell it; " \
        "write it as mem_fraction_static)" in strict.stderr
    assert "checked against the cached flag table of sglang 0.5.23 (the newest cached" in strict.stderr
    deploy("down", str(prof), home=tmp_path / "h")


def test_after_launch_an_unknown_flag_is_not_dropped_either(tmp_path: Path, sshd: Any) -> None:
    """Without preflight the engine's own argparse rejects it: no change drops it; the launch fails once."""
    prof = write_profile(tmp_path, sshd, name="zzq-late", args={"zzq_totally_unknown": 7})
    up = deploy("up", str(prof), "--json", "--skip-preflight", home=tmp_path / "h")
    assert up.returncode == 5, up.stderr + up.stdout[-2000:]
    report = next(e for e in events(up.stdout) if e["event"] == "report")
    (attempt,) = report["attempts"]
    assert attempt["diagnosis"]["signature"] == "unrecognized-arguments" and attempt["change"] is None
    assert "dropped" not in up.stdout + up.stderr


def test_gpu_indices_the_box_does_not_have_are_refused_before_launch(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="gpu3", env=gpus_env(tmp_path, 1), extra={"engine": {"gpus": [3]}})
    plan = deploy("plan", str(prof), home=tmp_path / "h")
    assert plan.returncode == 4, plan.stderr + plan.stdout
    assert "  - engine.gpus: GPU 3 is not on this box (the box has 1 GPU: 0)" in plan.stdout
    assert "memory plan" not in plan.stdout and "division" not in plan.stdout + plan.stderr
    up = deploy("up", str(prof), home=tmp_path / "h")
    assert up.returncode == 4 and "preflight: engine.gpus: GPU 3 is not on this box (the box has 1 GPU: 0)" in up.stderr


def test_fewer_gpus_than_tp_size_is_refused_before_launch(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="tp2", args={"tp_size": 2}, env=gpus_env(tmp_path, 2),
                         extra={"engine": {"gpus": [0]}})
    up = deploy("up", str(prof), "--json", home=tmp_path / "h")
    assert up.returncode == 4, up.stderr + up.stdout[-2000:]
    problems = [e["message"] for e in events(up.stdout) if e["event"] == "problem"]
    assert problems == ["tp_size 2 needs 2 GPUs, but engine.gpus gives it 1 (0)"]
    both = write_profile(tmp_path, sshd, name="tp2ok", args={"tp_size": 2}, env=gpus_env(tmp_path, 2),
                         extra={"engine": {"gpus": [0, 1]}})
    plan = deploy("plan", str(both), home=tmp_path / "h")
    assert "needs 2 GPUs" not in plan.stdout


def test_plan_of_a_change_to_a_running_deployment_is_not_busy(tmp_path: Path, sshd: Any) -> None:
    """`up` replaces its own running version; `plan` said "port ... BUSY" and exit 4."""
    prof = write_profile(tmp_path, sshd, name="replan")
    assert deploy("up", str(prof), home=tmp_path / "h").returncode == 0
    try:
        data = yaml.safe_load(prof.read_text())
        data["engine"]["args"] = {"max_running_requests": 16}
        prof.write_text(yaml.safe_dump(data, sort_keys=False))
        plan = deploy("plan", str(prof), home=tmp_path / "h")
        assert plan.returncode == 0, plan.stderr + plan.stdout
        assert "held by this deployment's running version (up replaces it)" in plan.stdout
        assert "BUSY" not in plan.stdout and "already in use" not in plan.stdout
        as_json = json.loads(deploy("plan", str(prof), "--json", home=tmp_path / "h").stdout)
        assert as_json["ok"] is True and as_json["own_port"] is True
    finally:
        deploy("down", str(prof), home=tmp_path / "h")


def test_a_value_argparse_rejects_shows_argparse_s_message(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="tptwo", args={"tp_size": "two"})
    plan = deploy("plan", str(prof), home=tmp_path / "h")
    assert plan.returncode == 4
    assert ("the engine rejects these arguments (parse): sglang serve: error: argument --tp-size/"
            "--tensor-parallel-size: invalid int value: 'two'") in plan.stdout
    assert "argparse exit 2" not in plan.stdout + plan.stderr
