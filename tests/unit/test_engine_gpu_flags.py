"""Each engine's parallelism flags (Launch.gpu_flags) against the flag tables generated from the real parsers,
and the GPU count read from a profile's args (used by `deploy export k8s` for the pods' GPU requests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployer.engines import engine_for

STANDIN = Path(__file__).resolve().parents[1] / "standin"
TABLES = {
    "sglang": [STANDIN / "sglang" / "srt" / "flags_0_5_23.json", STANDIN / "sglang" / "srt" / "flags_0_5_10.json"],
    "vllm": [STANDIN / "vllm" / "entrypoints" / "openai" / "flags_0_33_0.json"],
}


def _actions(table: Path) -> list[dict[str, object]]:
    return list(json.loads(table.read_text(encoding="utf-8"))["actions"])


@pytest.mark.parametrize("kind,table", [(k, t) for k, ts in TABLES.items() for t in ts])
def test_every_name_of_a_gpu_flag_is_one_int_option_of_the_real_parser(kind: str, table: Path) -> None:
    spec = engine_for(kind)
    assert spec.launch.gpu_flags, kind
    actions = _actions(table)
    for names in spec.launch.gpu_flags:
        options = {"--" + n.replace("_", "-") for n in names}
        owners = [a for a in actions if options & set(a["option_strings"])]  # type: ignore[arg-type]
        assert len(owners) == 1, (kind, names, [a["dest"] for a in owners])
        assert options <= set(owners[0]["option_strings"]), (names, owners[0]["option_strings"])  # type: ignore[arg-type]
        assert owners[0]["type"] == "int", owners[0]


@pytest.mark.parametrize("kind,args,want", [
    ("sglang", {}, 1),
    ("sglang", {"tp_size": 8}, 8),
    ("sglang", {"tensor_parallel_size": 4, "pp_size": 2}, 8),
    ("sglang", {"tp_size": 0, "pp_size": True}, 1),      # not a positive int: counts 1
    ("vllm", {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, 4),
    ("vllm", {"tp_size": 8}, 1),                           # not a vLLM flag
])
def test_gpus_per_engine(kind: str, args: dict[str, object], want: int) -> None:
    assert engine_for(kind).launch.gpus_per_engine(args) == want
