"""deployer.prepare.compat: the compatibility rules (data with sources) against host facts and the dry resolution;
the resolutions are the real pip report of this machine (torch 2.13.0+cpu from find-links) or built from it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from deployer.prepare.compat import (CHECKS, Demand, Gpu, HostFacts, Rule, check, estimate_env_bytes, load_rules,
                                     parse_caps,
                                     parse_df_available, parse_smi, torch_cuda)
from deployer.prepare.envspec import ResolvedDist
from deployer.prepare.install_plan import parse_pip_report

CASES = Path(__file__).parent.parent / "cases" / "install"
REPORT = parse_pip_report((CASES / "pip-dry-run-report-torch.txt").read_text(encoding="utf-8"))
# A real nvidia-smi banner, as quoted in pytorch/tutorials commit 3eef691 (a Tesla M60 host, 2023-06-16).
BANNER_525 = "| NVIDIA-SMI 525.105.17 Driver Version: 525.105.17 CUDA Version: 12.1 |"
H200 = Gpu(0, "NVIDIA H200", (9, 0))
B200 = Gpu(0, "NVIDIA B200", (10, 0))
L40S = Gpu(0, "NVIDIA L40S", (8, 9))
GIB = 1 << 30


def torch_build(local: str) -> tuple[ResolvedDist, ...]:
    """The real report with torch's build changed (+cu128 instead of +cpu), the rest as resolved."""
    return tuple(dataclasses.replace(d, version=f"2.13.0+{local}") if d.key == "torch" else d for d in REPORT)


def facts(**kw: object) -> HostFacts:
    base: dict[str, object] = {"driver_version": "580.95.05", "driver_cuda": (13, 0), "gpus": (H200,),
                               "python_version": "3.11.7", "shm_bytes": 25275781120, "env_free_bytes": 500 * GIB}
    base.update(kw)
    return HostFacts(**base)  # type: ignore[arg-type]


def ids(problems: list[object]) -> list[str]:
    return [p.rule for p in problems]  # type: ignore[attr-defined]


SGLANG = Demand("sglang")


def test_parsers_on_real_texts() -> None:
    assert parse_smi(BANNER_525) == ("525.105.17", (12, 1))
    assert parse_smi("NVIDIA-SMI version  : 580.95.05\nDRIVER version      : 580.95.05\nCUDA Version        : 13.0\n"
                     ) == ("580.95.05", (13, 0))
    assert parse_smi("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.") == (None, None)
    assert parse_caps("0, NVIDIA H200, 9.0\n1, NVIDIA B200, 10.0\nNo devices were found\n") == (
        H200, Gpu(1, "NVIDIA B200", (10, 0)))
    assert parse_df_available((CASES / "host" / "df-shm.txt").read_text()) == 25275781120


def test_torch_build_from_the_real_report_and_from_the_runtime_wheel() -> None:
    torch, label, cuda = torch_cuda(REPORT)
    assert torch is not None and torch.version == "2.13.0+cpu" and (label, cuda) == ("cpu", None)
    assert torch_cuda(torch_build("cu128"))[1:] == ("cu128", (12, 8))
    assert torch_cuda(torch_build("cu130"))[1:] == ("cu130", (13, 0))
    plain = (ResolvedDist("torch", "2.8.0"), ResolvedDist("nvidia-cuda-runtime-cu12", "12.8.90"))
    assert torch_cuda(plain)[1:] == ("cu128", (12, 8))
    assert torch_cuda((ResolvedDist("six", "1.16.0"),)) == (None, None, None)


def test_a_cpu_torch_on_a_gpu_host_is_refused_but_fine_on_a_cpu_host() -> None:
    problems = check(facts(), REPORT, SGLANG)
    assert ids(problems) == ["torch-not-a-cuda-build"]
    assert "torch 2.13.0+cpu is a cpu build" in problems[0].line and "whl/cu128" in problems[0].line
    assert check(facts(gpus=()), REPORT, SGLANG) == []                       # this dev machine: no GPU


def test_driver_too_old_for_the_torch_build() -> None:
    major = check(facts(driver_version="470.82", driver_cuda=(11, 4)), torch_build("cu128"), SGLANG)
    assert ids(major) == ["driver-cuda-major"] and major[0].severity == "error"
    assert "upgrade the driver to >= 525" in major[0].line and "whl/cu114" in major[0].line
    minor = check(facts(driver_version="525.105.17", driver_cuda=parse_smi(BANNER_525)[1]), torch_build("cu128"),
                  SGLANG)
    assert ids(minor) == ["driver-cuda-minor"] and minor[0].severity == "warning"
    assert check(facts(driver_cuda=(12, 8)), torch_build("cu128"), SGLANG) == []


def test_blackwell_needs_a_cuda_12_8_build() -> None:
    problems = check(facts(gpus=(B200,)), torch_build("cu126"), SGLANG)
    assert ids(problems) == ["blackwell-needs-cuda-12.8"]
    assert "GPU 0 (NVIDIA B200, sm100)" in problems[0].line and "cu128" in problems[0].line
    assert check(facts(gpus=(B200,)), torch_build("cu128"), SGLANG) == []
    assert check(facts(gpus=(H200,)), torch_build("cu126"), SGLANG) == []


@pytest.mark.parametrize("gpu,demand,rule", [
    (B200, Demand("sglang", args={"attention_backend": "fa3"}), "sglang-fa3-capability"),
    (Gpu(0, "Tesla T4", (7, 5)), Demand("sglang", args={"attention_backend": "fa3"}), "sglang-fa3-capability"),
    (H200, Demand("sglang", args={"attention_backend": "trtllm_mha"}), "sglang-trtllm-blackwell-only"),
    (L40S, Demand("vllm", env={"VLLM_FLASH_ATTN_VERSION": "3"}), "vllm-fa3-capability"),
    (Gpu(0, "Tesla P100", (6, 0)), Demand("vllm"), "vllm-min-capability")])
def test_kernels_the_gpu_lacks(gpu: Gpu, demand: Demand, rule: str) -> None:
    problems = check(facts(gpus=(gpu,)), torch_build("cu128"), demand)
    assert ids(problems) == [rule]
    assert gpu.name in problems[0].line


@pytest.mark.parametrize("gpu,demand", [
    (H200, Demand("sglang", args={"attention_backend": "fa3"})),
    (L40S, Demand("sglang", args={"attention_backend": "flashinfer"})),
    (B200, Demand("sglang", args={"attention_backend": "trtllm_mha"})),
    (H200, Demand("vllm", env={"VLLM_FLASH_ATTN_VERSION": "3"})),
    (B200, Demand("vllm", args={"attention_backend": "fa3"}))])          # an sglang flag on vllm: not its rule
def test_kernels_the_gpu_has(gpu: Gpu, demand: Demand) -> None:
    assert check(facts(gpus=(gpu,)), torch_build("cu128"), demand) == []


def test_fa3_line_says_what_to_use_instead() -> None:
    line = check(facts(gpus=(B200,)), torch_build("cu128"), Demand("sglang", args={"attention_backend": "fa3"}))[0].line
    assert line == ("engine.args.attention_backend=fa3 needs sm8x/sm9x; GPU 0 (NVIDIA B200) is sm100: "
                    "use --attention-backend flashinfer (or triton)")


def test_wheel_python_tags_against_the_hosts_python() -> None:
    problems = check(facts(python_version="3.12.3"), torch_build("cu128"), SGLANG)
    assert ids(problems) == ["wheel-python-tag"] * 2                 # the report's two cp311 wheels
    assert problems[0].line.startswith("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl is for cp311")
    assert problems[1].line.startswith("markupsafe-3.0.4-cp311-cp311-") and "MarkupSafe with a cp312" in problems[1].line
    abi3 = ResolvedDist("cryptography", "44.0.0", "https://x/cryptography-44.0.0-cp39-abi3-manylinux_2_28_x86_64.whl")
    pure = ResolvedDist("six", "1.16.0", "https://x/six-1.16.0-py2.py3-none-any.whl")
    too_new = ResolvedDist("x", "1", "https://x/x-1-cp313-abi3-manylinux_2_28_x86_64.whl")
    got = check(facts(python_version="3.11.7"), (abi3, pure, too_new), SGLANG)
    assert ids(got) == ["wheel-python-tag"] and got[0].line.startswith("x-1-cp313-abi3")


def test_shm_matters_for_more_than_one_gpu() -> None:
    small = facts(shm_bytes=64 << 20)
    problems = check(small, torch_build("cu128"), Demand("sglang", gpus_used=8))
    assert ids(problems) == ["shm-multi-gpu"] and "0.1 GiB free and 8 GPUs" in problems[0].line
    assert check(small, torch_build("cu128"), Demand("sglang", gpus_used=1)) == []


def test_disk_for_the_environment_and_the_weights() -> None:
    sized = tuple(dataclasses.replace(d, size=191794682) if d.key == "torch" else d for d in torch_build("cu128"))
    unknown = len(sized) - 1
    short = check(facts(env_free_bytes=2 * GIB), sized, Demand("sglang", weights_bytes=16 * GIB))
    assert ids(short) == ["disk-env-and-weights"]
    assert short[0].line.startswith(f"the environment (~0.6 GiB) and the weights (16.0 GiB) (and {unknown} packages "
                                    "of unknown size) need 18.6 GiB")
    assert check(facts(env_free_bytes=20 * GIB), sized, Demand("sglang", weights_bytes=16 * GIB)) == []
    apart = facts(env_free_bytes=20 * GIB, weights_free_bytes=10 * GIB, same_filesystem=False)
    split = check(apart, sized, Demand("sglang", weights_bytes=16 * GIB))
    assert [p.line.split(" need ")[0] for p in split] == ["the weights (16.0 GiB)"]


def test_errors_come_first_and_every_rule_is_sourced_data() -> None:
    problems = check(facts(driver_cuda=(12, 1), shm_bytes=1, gpus=(B200,)), torch_build("cu126"),
                     Demand("sglang", gpus_used=2))
    assert [p.severity for p in problems] == sorted((p.severity for p in problems), key=lambda s: s != "error")
    assert "driver-cuda-minor" in ids(problems) and problems[-1].severity == "warning"
    rules = load_rules()
    assert len({r.id for r in rules}) == len(rules)
    for rule in rules:
        assert rule.check in CHECKS and rule.severity in ("error", "warning")
        assert re.search(r"https?://|[a-z_]+/[a-z_/]+\.(py|md|txt)|#\d+|measured", rule.source), rule.id
    with pytest.raises(KeyError):
        check(facts(), REPORT, SGLANG, rules=(Rule("x", "no_such_check", "error", "s"),))


def test_the_unpack_factor_covers_the_measured_install() -> None:
    """numpy 2.1.3's wheel (16,339,644 bytes) took 30,570,467 + 25,507,947 bytes installed (du -sb, this machine)."""
    factor = float(next(r for r in load_rules() if r.id == "disk-env-and-weights").params["unpack_factor"])
    wheel = ResolvedDist("numpy", "2.1.3", size=16339644)
    estimate, unknown = estimate_env_bytes((wheel, ResolvedDist("six", "1.16.0")), factor)
    assert unknown == 1 and 30570467 + 25507947 <= estimate < 2 * (30570467 + 25507947)
