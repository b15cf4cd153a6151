"""`deploy plan`'s memory picture (issue 26, item 5): each engine's plan as a budget, the bar drawn at several widths
on a terminal and piped, and what the engine's log says it allocated for its KV cache, read with each engine's own
patterns (deployer/engines/<kind>/spec.py) from the log captures in tests/cases (real CPU captures: good-startup;
the GPU lines from the cases' assembled 0.5.x / 0.33.0 logs, see each expected.yaml's source)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.engines import engine_for
from deployer.engines.base import GpuBudget, KvAllocated, MemoryBudget, kv_allocated_in
from deployer.engines.sglang.memory import MemoryPlan
from deployer.engines.vllm.memory import VllmMemoryPlan
from deployer.output.memory import allocated_lines, budget_lines, cells

CASES = Path(__file__).resolve().parents[1] / "cases"
H200 = 143771


def _allocated(kind: str, log: str) -> KvAllocated | None:
    return kv_allocated_in(engine_for(kind).log.kv_allocated, (CASES / kind / log).read_text())


def test_what_sglang_says_it_allocated() -> None:
    real = _allocated("sglang", "good-startup.log")            # real SGLang 0.5.23, its CPU engine
    assert real is not None and real.tokens == 8192 and real.mib == 0.0
    gpu = _allocated("sglang", "cuda-oom.log")                  # the Mamba pool's line comes first, not taken
    assert gpu is not None and gpu.tokens == 1032192 and gpu.mib == pytest.approx(2 * 7.88 * 1024)
    assert gpu.line.startswith("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1032192")


def test_what_vllm_says_it_allocated() -> None:
    real = _allocated("vllm", "good-startup.log")               # real vLLM 0.32.0, the CPU build
    assert real is not None and real.tokens == 2_097_152 and real.mib is None
    gpu = _allocated("vllm", "cuda-graph-capture-oom.log")
    assert gpu is not None and gpu.tokens == 812_544 and gpu.mib == pytest.approx(111.59 * 1024)
    assert "Available KV cache memory: 111.59 GiB" in gpu.line and "GPU KV cache size: 812,544 tokens" in gpu.line
    assert kv_allocated_in(engine_for("vllm").log.kv_allocated, "nothing about a cache") is None


def test_each_engines_plan_as_a_budget() -> None:
    sglang = MemoryPlan(gpu_total_mib=H200, gpu_free_mib=H200 - 1000, weights_per_gpu_mib=15_623.0,
                        mem_fraction_static=0.9, mfs_auto=False, reserved_mib=0.0, kv_cell_bytes=147_456,
                        kv_tokens=800_000, context_len=40960, max_running_requests=4096,
                        mamba_state_bytes=1 << 20, mamba_slots=100)
    b = sglang.budget()
    assert b.kv_cache_mib == pytest.approx(800_000 * 147_456 / (1 << 20)) and b.mamba_state_mib == 100.0
    assert b.activations_graphs_mib == pytest.approx((H200 - 1000) * 0.1)
    assert b.headroom_mib == pytest.approx(H200 - b.used_mib)
    assert sglang.kv_estimate().tokens == 800_000
    vllm = VllmMemoryPlan(gpu_total_mib=H200, gpu_free_mib=H200, gpu_memory_utilization=0.9, requested_mib=0.0,
                          weights_per_gpu_mib=15_623.0, non_torch_mib=500.0, activation_mib=2000.0,
                          cuda_graph_mib=700.0, kv_memory_mib=110_000.0, block_size=16, bytes_per_block=1,
                          kv_blocks=1, kv_tokens=780_000, max_model_len=40960, max_num_seqs=256)
    assert vllm.budget() == MemoryBudget(H200, 15_623.0, 110_000.0, 0.0, 3200.0)
    assert vllm.budget().to_json()["headroom_mib"] == round(H200 - 15_623 - 110_000 - 3200, 1)


GPU = GpuBudget(0, "NVIDIA H200", MemoryBudget(H200, 15_623.0, 98_000.0, 2_000.0, 14_377.0))


@pytest.mark.parametrize("width", [40, 60, 80, 100, 160])
def test_the_bar_fits_the_width_piped(width: int) -> None:
    lines = budget_lines([GPU], width, terminal=False)
    assert lines[:2] == ["memory per GPU:", "  GPU 0 NVIDIA H200: 140.4 GiB"]
    drawn = lines[2]
    assert len(drawn) == width and drawn.startswith("  [") and drawn.endswith("]")
    inside = drawn[3:-1]
    assert inside == "".join(sorted(inside, key="WKMA.".index))     # the parts in order, headroom last
    counts = {c: inside.count(c) for c in "WKMA."}
    assert all(counts[c] >= 1 for c in "WKMA.")
    assert counts["K"] == pytest.approx(98_000 / H200 * (width - 4), abs=1.5)
    assert all(len(line) <= width and line.isascii() for line in lines)
    legend = " ".join(lines[3:])
    for text in ("W weights 15.3 GiB", "K KV cache 95.7 GiB", "M Mamba state 2.0 GiB",
                 "A activations+graphs 14.0 GiB", ". headroom 13.4 GiB"):
        assert text in legend, (width, lines)


def test_on_a_terminal_the_parts_are_shades_and_a_narrow_one_is_cut() -> None:
    lines = budget_lines([GPU], 80, terminal=True)
    assert set(lines[2].strip()[1:-1]) == {"\u2588", "\u2593", "\u2592", "\u2591", "\u00b7"}
    assert "\u2588 weights 15.3 GiB" in lines[3]
    narrow = budget_lines([GPU], 16, terminal=True)
    assert all(len(line) <= 16 for line in narrow) and narrow[1].endswith("\u2026")
    assert len(narrow[2]) == 16
    assert len(budget_lines([GPU], 12, terminal=True)[2]) == 14     # never fewer than 10 cells
    piped = budget_lines([GPU], 16, terminal=False)
    assert piped[1].endswith("...") and all(len(line) <= 16 for line in piped)


def test_a_plan_over_the_gpu_is_marked() -> None:
    over = GpuBudget(1, None, MemoryBudget(24_000, 20_000, 8_000, 0, 1_000))
    lines = budget_lines([over], 60, terminal=False)
    assert lines[1] == "  GPU 1: 23.4 GiB" and lines[2].endswith("!]") and "." not in lines[2]
    assert "! over the GPU by 4.9 GiB" in " ".join(lines[3:])
    full = budget_lines([GpuBudget(0, None, MemoryBudget(24_000, 20_000, 4_010, 0, 0))], 60, terminal=False)
    assert "!" not in "".join(full) and ". headroom 0.0 GiB" in full[-1]     # 10 MiB over: rounding, full


def test_cells_share_the_width_exactly() -> None:
    assert cells([1, 1, 1], 10) == [4, 3, 3] and sum(cells([5, 0.001, 90], 20)) == 20
    assert cells([5, 0.001, 90], 20)[1] == 1 and cells([0, 0], 5) == [0, 0]


def test_allocated_beside_the_estimate() -> None:
    engine = KvAllocated(1_814_430, 113_377.3, "KV Cache is allocated. ...")
    lines = allocated_lines(KvAllocated(816_190, 114_790.0, "x"), engine, "run-7")
    assert lines == ["KV cache the engine allocated (run run-7): 1,814,430 tokens, 110.7 GiB",
                     "  deployer's estimate: 816,190 tokens, 112.1 GiB", "  from: KV Cache is allocated. ..."]
    assert allocated_lines(None, None, None) == []
    assert allocated_lines(None, KvAllocated(5, None, "l"), "r")[0].endswith("5 tokens, size not said")
