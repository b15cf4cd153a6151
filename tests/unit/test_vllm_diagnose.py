"""vLLM diagnosis: the vLLM logs of tests/cases/vllm (real 0.32.0 CPU captures, and synthetic GPU-only ones) against
engines/vllm/signatures.yaml and the engine-neutral engines/common/signatures.yaml."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer.diagnose.diagnosis import clean_line, diagnose, first_traceback
from deployer.engines import engine_for
from deployer.remedy.propose import remedy_spec, resolve
from deployer.diagnose.signatures import common_signatures, engine_signatures, load_signatures

CASES = Path(__file__).parent.parent / "cases" / "vllm"
SGLANG_CASES = Path(__file__).parent.parent / "cases" / "sglang"
PREFIX = engine_for("vllm").log.prefix


def _log(path: Path) -> str:
    return path.read_bytes().decode("utf-8")  # keeps the \r of vLLM's re-prefixed lines


EXPECTED: dict[str, dict[str, Any]] = yaml.safe_load(_log(CASES / "expected.yaml"))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_case(name: str) -> None:
    exp = EXPECTED[name]
    text = _log(CASES / f"{name}.log")
    if "phases" in exp:
        assert engine_for("vllm").log.phases_in(text) == exp["phases"]
    if exp["signature"] is None and "phases" in exp:
        return      # a good startup: nothing to diagnose
    d = diagnose(text, exit_code=exp["exit_code"], engine=engine_for("vllm"))
    assert d.signature == exp["signature"], d.summary
    out = d.to_json()
    json.dumps(out)
    got = None if out["remedy"] is None else {k: out["remedy"][k] for k in ("args", "env")}
    assert got == exp["remedy"], out["remedy"]
    assert d.evidence and all("pid=" not in e and "\r" not in e for e in d.evidence), d.evidence
    assert d.hint
    if "summary" in exp:
        assert d.summary.startswith(exp["summary"]), d.summary
    assert "sglang" not in d.summary.lower() and "sglang" not in (d.hint or "").lower()
    if "exception" in exp or "rank" in exp:
        tb = first_traceback(text, PREFIX)
        assert tb is not None
        if "exception" in exp:
            assert tb.exception.startswith(exp["exception"]), tb.exception
        if "rank" in exp:
            assert tb.rank == exp["rank"]


def test_every_vllm_signature_has_a_case() -> None:
    covered = {e["signature"] for e in EXPECTED.values()}
    assert {s.id for s in engine_signatures(engine_for("vllm"))} <= covered


def test_every_signature_names_its_source_in_the_release() -> None:
    for sig in engine_signatures(engine_for("vllm")):
        assert re.search(r"0\.3[23]\.0", sig.source) and ".py" in sig.source, sig.id


def test_the_real_failures_are_diagnosed_as_their_own_cause() -> None:
    """The real 0.32.0 captures: each names its root cause (not the API server's wrapper, not a generic failure)."""
    real = {n for n, e in EXPECTED.items() if e["provenance"]["kind"] == "real CPU capture" and e["signature"]}
    assert len(real) >= 10
    for name in real:
        d = diagnose(_log(CASES / f"{name}.log"), exit_code=EXPECTED[name]["exit_code"], engine=engine_for("vllm"))
        assert d.signature not in (None, "engine-core-init-failed"), name


def test_the_root_cause_wins_over_the_wrapper() -> None:
    """The API server's `Engine core initialization failed` comes last; the EngineCore's error is the answer."""
    text = _log(CASES / "kv-cache-too-small.log")
    assert "Engine core initialization failed. See root cause above." in text
    assert diagnose(text, exit_code=1, engine=engine_for("vllm")).signature == "kv-cache-too-small-for-max-model-len"


def test_vllm_logs_never_match_sglang_signatures() -> None:
    sglang_own = {s.id for s in engine_signatures(engine_for("sglang"))} - {s.id for s in engine_signatures(engine_for("vllm"))}
    for log in sorted(CASES.glob("*.log")):
        d = diagnose(_log(log), exit_code=1, engine=engine_for("vllm"))
        assert d.signature is None or d.signature not in sglang_own, log.name
    # and the other way round: an SGLang log read as vLLM gets vLLM's or the engine-neutral signatures only
    allowed = {s.id for s in load_signatures(engine_for("vllm"))}
    for log in sorted(SGLANG_CASES.glob("*.log"))[:12]:
        d = diagnose(_log(log), exit_code=1, engine=engine_for("vllm"))
        assert d.signature is None or d.signature in allowed, log.name


def test_engine_neutral_signatures_are_shared_not_copied() -> None:
    common = {s.id for s in common_signatures()}
    assert {"port-in-use", "hf-repo-not-found", "hf-offline-not-cached", "hf-gated-repo", "python-import-error",
            "cuda-error", "nccl-error"} <= common
    for kind in ("vllm", "sglang"):
        own = [s.id for s in engine_signatures(engine_for(kind))]
        assert not common & set(own), kind
        assert [s.id for s in load_signatures(engine_for(kind))] == own + [s.id for s in common_signatures()]
    assert load_signatures(None) == common_signatures()


def test_sglang_kind_does_not_know_vllm_texts() -> None:
    d = diagnose(_log(CASES / "kv-cache-too-small.log"), exit_code=1, engine=engine_for("sglang"))
    assert d.signature != "kv-cache-too-small-for-max-model-len"


def test_logger_prefix_is_stripped_with_the_process_tag() -> None:
    line = clean_line("(Worker_TP1 pid=4242) WARNING 11-30 23:40:00 [gpu_worker.py:773] Available KV cache memory: 3.1 GiB",
                      PREFIX)
    assert line.text == "Available KV cache memory: 3.1 GiB" and line.tag == "Worker_TP1"
    old = clean_line("INFO 11-30 23:40:00 [api_server.py:1 ] x", PREFIX)
    assert old.text == "INFO 11-30 23:40:00 [api_server.py:1 ] x"  # not vLLM's shape: left alone
    assert clean_line("INFO 06-01 10:00:00 [api_server.py:1077] Starting vLLM API server on http://0.0.0.0:8000",
                      PREFIX).text.startswith("Starting vLLM API server")


def test_kv_remedy_uses_the_estimate_and_falls_back_to_utilization() -> None:
    sig = next(s for s in load_signatures(engine_for("vllm")) if s.id == "kv-cache-too-small-for-max-model-len")
    assert sig.remedy is not None
    msg = ("ValueError: To serve at least one request with the model's max seq len (131072), (16.00 GiB KV cache is "
           "needed, which is larger than the available KV cache memory (9.25 GiB). Based on the available memory, "
           "the estimated maximum model length is 75776. Try increasing `gpu_memory_utilization`")
    change = resolve(sig.remedy, msg, args={"max_model_len": 131072}, env={}, engine=engine_for("vllm"))
    assert change is not None and change.args == {"max_model_len": 75776}
    # no estimate in the message (it is omitted when it would be 0): raise the utilization instead
    bare = msg.replace("Based on the available memory, the estimated maximum model length is 75776. ", "")
    change = resolve(sig.remedy, bare, args={"max_model_len": 131072, "gpu_memory_utilization": 0.85}, env={}, engine=engine_for("vllm"))
    assert change is not None and change.args == {"gpu_memory_utilization": 0.88}


def test_free_memory_remedy_is_computed_from_free_over_total() -> None:
    sig = next(s for s in load_signatures(engine_for("vllm")) if s.id == "free-memory-below-utilization")
    assert sig.remedy is not None
    msg = ("ValueError: Free memory on device cuda:0 (60.00/80.00 GiB) on startup is less than desired GPU memory "
           "utilization (0.9, 72.00 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.")
    change = resolve(sig.remedy, msg, args={"gpu_memory_utilization": 0.9}, env={}, engine=engine_for("vllm"))
    assert change is not None and change.args == {"gpu_memory_utilization": 0.73}  # 0.75 - 0.02
    # already below the ratio: a plain step down instead (never up); the message's value is what the engine used
    below = msg.replace("utilization (0.9, 72.00 GiB)", "utilization (0.7, 56.00 GiB)")
    change = resolve(sig.remedy, below, args={"gpu_memory_utilization": 0.7}, env={}, engine=engine_for("vllm"))
    assert change is not None and change.args == {"gpu_memory_utilization": 0.65}
    # the message wins over the profile: the engine said 0.9 (the profile is stale or was overridden)
    change = resolve(sig.remedy, msg, args={"gpu_memory_utilization": 0.7}, env={}, engine=engine_for("vllm"))
    assert change is not None and change.args == {"gpu_memory_utilization": 0.73}
    assert "engine message 0.9" in change.reason


def _cli(*argv: str) -> Any:
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    return subprocess.run([sys.executable, "-m", "deployer.cli", *argv], capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"]}, cwd=str(repo))


def test_cli_diagnoses_a_vllm_log_file_with_engine_vllm() -> None:
    log = str(CASES / "kv-cache-too-small.log")
    out = _cli("diagnose", "--log", log, "--engine", "vllm", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["signature"] == "kv-cache-too-small-for-max-model-len"
    assert {k: data["remedy"][k] for k in ("args", "env")} == {"args": {"max_model_len": 384}, "env": {}}
    assert data["engine"] == {"kind": "vllm", "how": "given"}
    told = json.loads(_cli("diagnose", "--log", log, "--json").stdout)   # no --engine: the log says vLLM
    assert told["engine"] == {"kind": "vllm", "how": "detected from the log"}
    assert told["signature"] == data["signature"] and told["remedy"] == data["remedy"]
    as_sglang = json.loads(_cli("diagnose", "--log", log, "--engine", "sglang", "--json").stdout)
    assert as_sglang["signature"] != data["signature"]
    bad = _cli("diagnose", "--log", log, "--engine", "tgi")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    # the log where a profile goes: one line that names --log, not the profile loader's unknown keys
    misplaced = _cli("diagnose", log)
    assert misplaced.returncode == 2 and "Traceback" not in misplaced.stderr, misplaced.stderr
    assert f"is not a profile; to diagnose a log file: deploy diagnose --log {log}" in misplaced.stderr
    assert "unknown key" not in misplaced.stderr, misplaced.stderr


def test_cli_renders_the_vllm_profile() -> None:
    out = _cli("render", "profiles/qwen3-8b-vllm.yaml", "--json")
    assert out.returncode == 0, out.stderr
    argv = json.loads(out.stdout)["argv"]
    assert argv[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "Qwen/Qwen3-8B"]
    assert "--enable-prefix-caching" in argv and argv[argv.index("--max-model-len") + 1] == "32768"


def test_unknown_flag_fixes_read_the_engines_own_renames_table() -> None:
    """SGLang renamed --cuda-graph-max-bs to --cuda-graph-max-bs-decode (its renames table); vLLM has no renames
    table, so for a vLLM log the same unknown flag is only respelt from the usage text (did-you-mean, said so), or
    refused when the usage has nothing close (issue 24: never dropped): never renamed by SGLang's table."""
    spec = remedy_spec({"fix_unknown_flags": r"error: unrecognized arguments: (.+)$"})
    usage = "usage: api_server.py [-h] [--cuda-graph-max-bs-decode N] [--max-num-seqs N]\n"
    msg = usage + "api_server.py: error: unrecognized arguments: --cuda-graph-max-bs 8"
    args = {"cuda_graph_max_bs": 8}
    as_sglang = resolve(spec, msg, args=args, env={}, engine=engine_for("sglang"))
    assert as_sglang is not None and as_sglang.args == {"cuda_graph_max_bs": None, "cuda_graph_max_bs_decode": 8}
    assert "did you mean" not in as_sglang.reason           # the table renamed it
    as_vllm = resolve(spec, msg, args=args, env={}, engine=engine_for("vllm"))
    assert as_vllm is not None and as_vllm.args == as_sglang.args
    assert "did you mean --cuda-graph-max-bs-decode?" in as_vllm.reason
    far = msg.replace("--cuda-graph-max-bs-decode N", "--max-cudagraph-capture-size N")
    assert resolve(spec, far, args=args, env={}, engine=engine_for("vllm")) is None
