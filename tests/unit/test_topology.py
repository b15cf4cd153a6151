"""Preflight's GPU topology (issue 24): GPU indices against the box, the count against the parallelism flags;
preflight's refusal of flags nothing may fix; argparse's own words for a rejected value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deployer.errors import ProfileError, ProfileProblems
from deployer.preflight.checks import PreflightReport, _argparse_message
from deployer.preflight.facts import Facts, Gpu
from deployer.preflight.topology import gpu_problems
from deployer.profile.loader import load_profile
from deployer.profile.model import Profile


def gpus(n: int) -> list[Gpu]:
    return [Gpu(i, "NVIDIA H200", f"GPU-{i}", 143771, 1, 143770) for i in range(n)]


def prof(kind: str = "sglang", gpus: list[int] | None = None, args: dict[str, Any] | None = None,
         env: dict[str, str] | None = None) -> Profile:
    return Profile.model_validate({"name": "p", "target": {"host": "local"},
                                   "engine": {"kind": kind, "model_path": "/m", "gpus": gpus, "args": args or {},
                                              "env": env or {}}})


def test_a_gpu_index_the_box_does_not_have() -> None:
    assert gpu_problems(prof(gpus=[3]), gpus(1)) == ["engine.gpus: GPU 3 is not on this box (the box has 1 GPU: 0)"]
    assert gpu_problems(prof(gpus=[1, 2, 3]), gpus(2)) == [
        "engine.gpus: GPU 2, 3 are not on this box (the box has 2 GPUs: 0, 1)"]
    assert gpu_problems(prof(env={"CUDA_VISIBLE_DEVICES": "5"}), gpus(2)) == [
        "engine.env.CUDA_VISIBLE_DEVICES: GPU 5 is not on this box (the box has 2 GPUs: 0, 1)"]


def test_fewer_gpus_than_the_parallelism_flags_need() -> None:
    assert gpu_problems(prof(gpus=[0], args={"tp_size": 2}), gpus(2)) == [
        "tp_size 2 needs 2 GPUs, but engine.gpus gives it 1 (0)"]
    assert gpu_problems(prof(args={"tp_size": 2, "pp_size": 2}), gpus(2)) == [
        "tp_size 2 x pp_size 2 needs 4 GPUs, but the box has 2 GPUs: 0, 1"]
    assert gpu_problems(prof("vllm", gpus=[0], args={"tensor_parallel_size": 2}), gpus(4)) == [
        "tensor_parallel_size 2 needs 2 GPUs, but engine.gpus gives it 1 (0)"]


def test_what_fits_passes() -> None:
    assert gpu_problems(prof(gpus=[0, 1], args={"tp_size": 2}), gpus(2)) == []
    assert gpu_problems(prof(args={"tp_size": 8}), gpus(8)) == []
    assert gpu_problems(prof(gpus=[1]), gpus(2)) == []
    assert gpu_problems(prof(gpus=[3]), []) == []   # no nvidia-smi answer: the facts say so already
    # one engine over nodes: tp 4 over --nnodes 2 is 2 GPUs per node
    assert gpu_problems(prof(args={"tp_size": 4, "nnodes": 2}), gpus(2)) == []
    assert gpu_problems(prof(args={"tp_size": 4, "nnodes": 2}), gpus(1)) == [
        "tp_size 4 over 2 nodes needs 2 GPUs per node, but the box has 1 GPU: 0"]


def test_refused_flags_are_one_profile_error_each_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("name: p\ntarget:\n  host: local\nengine:\n  model_path: /m\n  args:\n    tp_size: 1\n"
                    "    zzq_totally_unknown: 7\n    also_unknown: 1\n")
    profile = load_profile(path)
    report = PreflightReport(facts=Facts(), profile=profile)
    assert report.refusal() is None
    report.unknown_flags = {"zzq_totally_unknown": "unknown flag --zzq-totally-unknown for sglang 0.5.23 (...)"}
    one = report.refusal()
    assert isinstance(one, ProfileError) and one.exit_code == 2
    assert str(one) == (f"{path}:8: engine.args.zzq_totally_unknown: unknown flag --zzq-totally-unknown for sglang "
                        "0.5.23 (...)")
    report.unknown_flags["also_unknown"] = "unknown flag --also-unknown"
    both = report.refusal()
    assert isinstance(both, ProfileProblems) and [p.line for p in both.problems] == [8, 9]


def test_argparse_s_own_message_replaces_argparse_exit() -> None:
    stderr = ("usage: sglang serve [-h] [--tp-size TP_SIZE]\n"
              "sglang serve: error: argument --tp-size: invalid int value: 'two'\n")
    assert _argparse_message("argparse exit 2", stderr) == \
        "sglang serve: error: argument --tp-size: invalid int value: 'two'"
    assert _argparse_message("argparse exit 2", "") == "argparse exit 2"
    assert _argparse_message("ValueError: bad", stderr) == "ValueError: bad"
