"""drift: parse SGLang's resolved-args dump (both formats) and compare it with what the profile asked."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from deployer.engines import engine_for
from deployer.diagnose.drift import Drift, compare, parse_args_dump, same_value

CASES = Path(__file__).parent.parent / "cases" / "sglang"

NEW = (
    "[2026-11-29 12:00:00] server_args={'model_path': 'Qwen/Qwen3.6-27B', 'tp_size': 1, 'mem_fraction_static': 0.907, "
    "'trust_remote_code': True, 'disable_overlap_schedule': False, 'cuda_graph_bs_decode': [1, 2, 4, 8], "
    "'speculative_algorithm': 'EAGLE', 'mamba_radix_cache_strategy': 'no_buffer', 'max_running_requests': None, "
    "'json_model_override_args': '{}', 'api_key': None, 'chat_template': 'a, b: c'}\n"
    "[2026-11-29 12:00:01] Using default HuggingFace chat template with detected content format: string\n"
)
OLD = (
    "\x1b[32m[2025-03-01 10:00:00] server_args=ServerArgs(model_path='meta-llama/Llama-3.3-70B-Instruct', "
    "tokenizer_path='meta-llama/Llama-3.3-70B-Instruct', tp_size=2, mem_fraction_static=0.85, "
    "cuda_graph_bs=[1, 2, 4], load_format=<LoadFormat.AUTO: 'auto'>, disable_radix_cache=False, "
    "chat_template='x=(1, 2)', lora_paths={'a': '/p'}, dtype='auto', watchdog_timeout=300)\x1b[0m\n"
    "[2025-03-01 10:00:01] server_args={'model_path': 'second'}\n"
)

SGLANG_DUMP = engine_for("sglang").log.args_dump


def test_parse_dict_format() -> None:
    got = parse_args_dump(NEW, SGLANG_DUMP)
    assert got is not None
    assert got["model_path"] == "Qwen/Qwen3.6-27B" and got["tp_size"] == 1
    assert got["trust_remote_code"] is True and got["max_running_requests"] is None
    assert got["cuda_graph_bs_decode"] == [1, 2, 4, 8] and got["chat_template"] == "a, b: c"


def test_parse_old_serverargs_format_first_occurrence() -> None:
    got = parse_args_dump(OLD, SGLANG_DUMP)
    assert got is not None
    assert got["model_path"] == "meta-llama/Llama-3.3-70B-Instruct"       # the first dump, not the second
    assert got["tp_size"] == 2 and got["mem_fraction_static"] == 0.85
    assert got["cuda_graph_bs"] == [1, 2, 4] and got["lora_paths"] == {"a": "/p"}
    assert got["load_format"] == "<LoadFormat.AUTO: 'auto'>"              # not a literal: kept as text
    assert got["chat_template"] == "x=(1, 2)" and got["watchdog_timeout"] == 300


def test_parse_from_case_logs_and_absent() -> None:
    got = parse_args_dump((CASES / "capture-cuda-graph-failed.log").read_bytes().decode(), SGLANG_DUMP)
    assert got is not None and got["mamba_radix_cache_strategy"] == "extra_buffer"
    assert parse_args_dump("no dump here", SGLANG_DUMP) is None
    assert parse_args_dump("server_args=ServerArgs(model_path='x', tp_si", SGLANG_DUMP) is None   # cut off


def test_dict_with_non_literal_value_falls_back() -> None:
    got = parse_args_dump("server_args={'a': 1, 'b': <Enum.X: 2>, 'c': 'z'}", SGLANG_DUMP)
    assert got == {"a": 1, "b": "<Enum.X: 2>", "c": "z"}


def test_compare_reports_changes_and_unknowns() -> None:
    resolved = parse_args_dump(NEW, SGLANG_DUMP)
    assert resolved is not None
    asked = {
        "tp_size": "1",                            # same after normalising
        "trust_remote_code": True,
        "disable_overlap_schedule": False,
        "cuda_graph_bs_decode": "1 2 4 8",
        "mem_fraction_static": 0.88,               # engine changed it
        "speculative_algorithm": "NEXTN",          # engine maps NEXTN -> EAGLE
        "mamba_scheduler_strategy": "extra_buffer",  # old name: unknown to this engine
        "mamba-radix-cache-strategy": "extra_buffer",
        "max_running_requests": 48,
    }
    drifts = {d.flag: d for d in compare(asked, resolved)}
    assert set(drifts) == {"mem_fraction_static", "speculative_algorithm", "mamba_scheduler_strategy",
                           "mamba_radix_cache_strategy", "max_running_requests"}
    assert drifts["mamba_radix_cache_strategy"].describe() == \
        "asked mamba_radix_cache_strategy=extra_buffer, engine resolved no_buffer"
    assert drifts["mamba_scheduler_strategy"].kind == "unknown"
    assert "unknown to the engine" in drifts["mamba_scheduler_strategy"].describe()
    assert drifts["mem_fraction_static"].to_json() == {"flag": "mem_fraction_static", "asked": 0.88,
                                                       "resolved": 0.907, "kind": "changed"}


def test_same_value_normalisation() -> None:
    assert same_value("1", 1) and same_value(1, 1.0) and not same_value("x", 1)
    assert same_value("true", True) and same_value(False, False) and not same_value(True, False)
    assert same_value(False, None) and not same_value(48, None)
    assert same_value([1, "2"], [1, 2]) and same_value("1,2", [1, 2]) and not same_value([1], [1, 2])
    assert same_value('{"a": 1}', {"a": 1}) and same_value("auto", "auto")
    assert not same_value(True, 1.0)                      # a bare flag is not the number 1


@given(st.integers(min_value=-10**6, max_value=10**6))
def test_ints_match_their_text(n: int) -> None:
    assert same_value(str(n), n) and same_value(n, float(n))
    assert compare({"x": n}, {"x": n}) == [] and compare({"x": n}, {"x": n + 1}) == [Drift("x", n, n + 1)]


def test_engine_value_aliases_are_not_drift() -> None:
    from deployer.diagnose.drift import compare
    from deployer.engines.sglang.spec import SGLANG

    asked = {"speculative_algorithm": "NEXTN", "mamba_scheduler_strategy": "extra_buffer"}
    resolved = {"speculative_algorithm": "EAGLE", "mamba_scheduler_strategy": "no_buffer"}
    drifts = compare(asked, resolved, SGLANG.knowledge.value_aliases)
    assert [d.flag for d in drifts] == ["mamba_scheduler_strategy"]
    assert [d.flag for d in compare(asked, resolved)] == ["speculative_algorithm", "mamba_scheduler_strategy"]
