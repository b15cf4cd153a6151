"""GPU memory plan against worked numbers (SGLang 0.5.23's sizing, done by hand below)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployer.engines.sglang.memory import (
    ModelInfo,
    UnsupportedModel,
    auto_mem_fraction,
    kv_cell_bytes,
    mamba_state_bytes,
    model_shape,
    plan_memory,
    slots_per_request,
)

MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"
H200 = 143771  # MiB
MIB = 1 << 20
MTP = {"speculative_algorithm": "EAGLE", "speculative_num_draft_tokens": 4, "max_running_requests": 48}


def qwen36(weight_bytes: int = 51_000_000_000) -> ModelInfo:
    return ModelInfo(json.loads((MODELS / "qwen36-27b-like" / "config.json").read_text()), weight_bytes)


def test_mamba_state_per_slot_worked() -> None:
    # 48 linear layers (64 layers, every 4th full attention). Per layer on TP1:
    #   conv: conv_dim = 48 v-heads * 128 + 2 * 16 k-heads * 128 = 10240; (kernel 4 - 1) * 2 B bf16 -> 61,440 B
    #   ssm:  48 v-heads * 128 * 128 * 4 B fp32 -> 3,145,728 B
    # (61,440 + 3,145,728) * 48 = 153,944,064 B = 146.8 MiB = 0.143 GiB (the "~143 MB" per slot)
    shape = model_shape(qwen36())
    assert (shape.linear_layers, shape.full_layers, shape.draft_layers) == (48, 16, 1)
    assert mamba_state_bytes(shape, tp=1) == 153_944_064
    assert mamba_state_bytes(shape, tp=2) == 153_944_064 // 2
    assert mamba_state_bytes(shape, tp=1, ssm_dtype="bfloat16") == (61_440 + 3_145_728 // 2) * 48


def test_kv_cell_worked() -> None:
    # 4 kv heads * (256 + 256) * (16 full layers + 1 MTP layer) * 2 B = 69,632 B per token
    shape = model_shape(qwen36())
    assert kv_cell_bytes(shape, tp=1, speculative=True) == 69_632
    assert kv_cell_bytes(shape, tp=1) == 4 * 512 * 16 * 2
    assert kv_cell_bytes(shape, tp=1, kv_dtype="fp8_e4m3") == 4 * 512 * 16


def test_auto_mem_fraction_matches_sglang_on_h200() -> None:
    # No running-request cap: 512 + 1.5 * 8192 + 1/8 * 1024 + 2 * 256 = 13440 -> round(130331 / 143771, 3) = 0.907,
    # what SGLang 0.5.23 resolves on an H200 (tests/sglang_real checks the real resolution).
    assert auto_mem_fraction(H200, {}, 1, 1) == (0.907, 13440.0)
    # 48 running requests cap the decode graph batch at 48: 13440 - 2 * (256 - 48) = 13024 -> 0.909
    assert auto_mem_fraction(H200, MTP, 1, 1) == (0.909, 13024.0)
    # Small GPUs keep the 10 GiB floor only above 60 GiB: 24 GiB -> 512 + 1.5 * 4096 + 128 + 2 * 48
    assert auto_mem_fraction(24 * 1024, {}, 1, 1) == (round((24576 - 6880) / 24576, 3), 6880.0)


def test_slots_per_request() -> None:
    assert slots_per_request({}) == 5  # auto -> extra_buffer with overlap: 3 + 2
    assert slots_per_request({"disable_overlap_schedule": True}) == 3  # auto -> no_buffer
    assert slots_per_request({"mamba_radix_cache_strategy": "extra_buffer", "disable_overlap_schedule": True}) == 4
    assert slots_per_request({"mamba_scheduler_strategy": "extra_buffer_lazy"}) == 4
    assert slots_per_request({"disable_radix_cache": True}) == 1


def test_qwen36_mtp_on_one_h200_worked_example() -> None:
    """The case this tool exists for: 48 running requests, slots doubled by extra_buffer, one idle H200.

    free 143770 MiB, weights 51e9 B = 48637.4 MiB, mfs 0.909 (auto, see above)
    rest  = 143770 - 48637.4 - 143770 * (1 - 0.909) = 82049.5 MiB = 80.13 GiB
    mamba budget = rest * 0.9 / 1.9 = 37.95 GiB
    slots K = (budget - per * (1 + 4)) // (per * (1 + 4 / 5)) = 144        (per = 153,944,064 B, D = 4, 5/request)
    running cap = 144 // 5 = 28 < 48 requested -> SGLang caps max_running_requests to 28
    draft intermediates = per * (28 + 1) * 4 = 16.63 GiB; state pool = (144 + 1) * per = 20.79 GiB
    KV = 80.13 - 16.63 - 20.79 = 42.71 GiB // 69,632 B = 658,544 tokens
    """
    plan = plan_memory(qwen36(), MTP, [H200 - 1], [H200], tp=1)
    assert plan.fits and not plan.problems
    assert plan.mem_fraction_static == 0.909 and plan.mfs_auto
    assert plan.mamba_state_bytes == 153_944_064 and plan.slots_per_request == 5
    assert plan.mamba_slots == 144
    assert plan.max_running_requests == 28
    assert plan.kv_tokens == 658_544
    assert any("capped to 28" in w for w in plan.warnings)
    # bf16 SSM state halves the slot, which lifts the cap above 48
    assert any(s.startswith("mamba_ssm_dtype bfloat16: fits, 48 running") for s in plan.suggestions)
    rows = dict(plan.rows())
    assert rows["Mamba slots"] == "144" and rows["max running requests"] == "28"


def test_two_h200_with_tp2_lift_the_cap() -> None:
    plan = plan_memory(qwen36(), {**MTP, "tp_size": 2}, [H200 - 1] * 2, [H200] * 2, tp=2)
    assert plan.fits and plan.max_running_requests == 48 and not plan.warnings
    suggested = plan_memory(qwen36(), MTP, [H200 - 1] * 2, [H200] * 2, tp=1).suggestions
    assert any(s.startswith("tp_size 2: fits, 48 running") for s in suggested)


def test_weights_that_do_not_fit_are_a_problem_with_a_fix() -> None:
    # 40 GiB free: 0.907 * 40960 = 37151 MiB < 48637 MiB of weights; with TP2 each GPU holds 24319 MiB
    plan = plan_memory(qwen36(), {}, [40960, 143770], [H200, H200], tp=1)
    assert not plan.fits and plan.max_running_requests == 0
    assert plan.problems and plan.problems[0].startswith("weights (47.5 GiB per GPU) leave no memory")
    assert [s.split(":")[0] for s in plan.suggestions] == ["tp_size 2"]


def test_too_big_for_the_gpus_at_hand_suggests_more_gpus_like_these() -> None:
    # 160 GB of weights on one H200: nothing local fits; two H200s (80 GB each) would
    plan = plan_memory(qwen36(weight_bytes=160_000_000_000), {}, [H200 - 1], [H200], tp=1)
    assert not plan.fits
    assert len(plan.suggestions) == 1 and plan.suggestions[0].startswith("tp_size 2 on 2 GPUs like this one")
    # a model that no number of these GPUs could hold gets no suggestion rather than a wrong one
    huge = plan_memory(qwen36(weight_bytes=10**15), {}, [H200 - 1], [H200], tp=1)
    assert not huge.fits and huge.suggestions == []


def test_explicit_mamba_cache_too_small_cannot_serve() -> None:
    plan = plan_memory(qwen36(), {**MTP, "max_mamba_cache_size": 4}, [H200 - 1], [H200], tp=1)
    assert not plan.fits and plan.max_running_requests == 0
    assert any("cannot serve any request" in p for p in plan.problems)


def test_dense_model_has_no_mamba_rows() -> None:
    cfg = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
           "max_position_embeddings": 131072}
    plan = plan_memory(ModelInfo(cfg, 16_000_000_000), {}, [80000], [81559], tp=1)
    assert plan.fits and plan.mamba_state_bytes == 0
    assert plan.kv_cell_bytes == 8 * 256 * 32 * 2
    assert "Mamba slots" not in dict(plan.rows())


def test_mla_is_not_modelled() -> None:
    with pytest.raises(UnsupportedModel):
        model_shape(ModelInfo({"num_hidden_layers": 61, "kv_lora_rank": 512, "hidden_size": 7168}, None))


def test_auto_strategy_follows_the_installed_release() -> None:
    """0.5.10-0.5.13 turn `auto` into no_buffer (3 slots per request); 0.5.23 picks extra_buffer (5 with overlap)."""
    seed = plan_memory(qwen36(), {"mamba_scheduler_strategy": "auto"}, [H200 - 1], [H200], tp=1, version="0.5.10")
    assert (seed.mamba_strategy, seed.slots_per_request) == ("no_buffer", 3)
    unset = plan_memory(qwen36(), {}, [H200 - 1], [H200], tp=1, version="0.5.13")
    assert unset.mamba_strategy == "no_buffer"
    now = plan_memory(qwen36(), {"mamba_radix_cache_strategy": "auto"}, [H200 - 1], [H200], tp=1, version="0.5.23")
    assert (now.mamba_strategy, now.slots_per_request) == ("extra_buffer", 5)
    chosen = plan_memory(qwen36(), {"mamba_scheduler_strategy": "extra_buffer"}, [H200 - 1], [H200], tp=1,
                         version="0.5.10")
    assert chosen.mamba_strategy == "extra_buffer"      # an explicit choice is kept
