"""Telling a log's engine from the log itself (deployer.engines.detect, detect_kind), and `deploy diagnose --log` without
--engine: a vLLM log is read as vLLM's, an SGLang log as SGLang's, and a log neither engine's marks are in is read
with the engine-neutral signatures only: nothing falls back to an engine silently."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer.diagnose.diagnosis import diagnose
from deployer.diagnose.signatures import common_signatures
from deployer.engines import detect_kind
from deployer.engines import engine_for

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "cases"


def _log(engine: str, name: str) -> str:
    return (CASES / engine / f"{name}.log").read_bytes().decode("utf-8")


def _expected(engine: str) -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = yaml.safe_load((CASES / engine / "expected.yaml").read_text(encoding="utf-8"))
    return data


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_case_log_is_told_as_its_own_engine_or_not_at_all(engine: str) -> None:
    other = {"vllm": "sglang", "sglang": "vllm"}[engine]
    unknown = []
    for name in _expected(engine):
        kind = detect_kind(_log(engine, name))
        assert kind != other, name
        if kind is None:
            unknown.append(name)
    # only logs with no engine output at all (an empty log of a process killed before it printed) are not told
    assert all(not _log(engine, n).strip() for n in unknown), unknown


def test_every_real_vllm_capture_is_told_as_vllm() -> None:
    for name, exp in _expected("vllm").items():
        if exp["provenance"]["kind"] == "real CPU capture":
            assert detect_kind(_log("vllm", name)) == "vllm", name


def test_older_vllm_and_the_vllm_cli_are_told_too() -> None:
    assert detect_kind("INFO 06-01 10:00:00 [api_server.py:1077] Starting vLLM API server on http://0.0.0.0:8000\n") == "vllm"
    assert detect_kind("usage: vllm serve [-h] [model_tag]\nvllm serve: error: unrecognized arguments: --x\n") == "vllm"
    assert detect_kind("[2026-12-01 18:35:46] INFO:     Uvicorn running on http://127.0.0.1:1\n") is None


def test_a_log_with_no_engine_marks_is_not_given_an_engine() -> None:
    assert detect_kind("") is None
    assert detect_kind("Traceback (most recent call last):\n  File \"x.py\", line 1\nOSError: [Errno 98] "
                       "Address already in use\n") is None
    both = _log("vllm", "unrecognized-arguments") + _log("sglang", "real-unrecognized-arguments")
    assert detect_kind(both) is None            # two engines' marks: it cannot tell


def test_without_an_engine_only_the_engine_neutral_signatures_are_used() -> None:
    port = "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\nOSError: [Errno 98] Address already in use\n"
    d = diagnose(port, exit_code=1, engine=None)
    assert d.signature == "port-in-use" and d.engine_kind is None
    assert d.to_json()["remedy"] is None
    # an engine's own text is not known without its engine
    kv = _log("vllm", "kv-cache-too-small")
    assert diagnose(kv, exit_code=1, engine=None).signature not in {"kv-cache-too-small-for-max-model-len"}
    assert diagnose(kv, exit_code=1, engine=None).signature in {None, *(s.id for s in common_signatures())}
    assert diagnose("", signal=9, engine=None).signature == "killed-by-signal"


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deployer.cli", *argv], capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"]}, cwd=str(ROOT))


def test_diagnose_log_on_real_vllm_logs_needs_no_engine_and_never_says_sglang() -> None:
    expected = _expected("vllm")
    real = sorted(n for n, e in expected.items() if e["provenance"]["kind"] == "real CPU capture" and e["signature"])
    assert len(real) >= 10
    from click.testing import CliRunner

    from deployer.cli.main import cli

    for i, name in enumerate(real):
        argv = ("diagnose", "--log", str(CASES / "vllm" / f"{name}.log"))
        if i == 0:   # the command as a user runs it; the other captures in this process (21 CLI starts: ~30 s loaded)
            out = _cli(*argv)
            code, stdout, stderr = out.returncode, out.stdout, out.stderr
        else:
            got = CliRunner().invoke(cli, list(argv), prog_name="deploy")
            code, stdout, stderr = got.exit_code, got.stdout, repr(got.exception)
        assert code == 0, stderr
        assert "sglang" not in stdout.lower(), (name, stdout[:500])
        assert stdout.startswith("engine:    vllm (detected from the log)\n"), stdout[:200]
        assert f"signature: {expected[name]['signature']}\n" in stdout, (name, stdout[:300])


def test_diagnose_log_says_when_it_cannot_tell_the_engine(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("starting\nOSError: [Errno 98] Address already in use\n")
    out = _cli("diagnose", "--log", str(log), "--json")
    data = json.loads(out.stdout)
    assert data["engine"] == {"kind": None, "how": "not told by the log: engine-neutral signatures only"}
    assert data["signature"] == "port-in-use"
    text = _cli("diagnose", "--log", str(log)).stdout
    assert text.startswith("engine:    unknown (not told by the log: engine-neutral signatures only)\n")
    assert "sglang" not in text.lower()


def test_an_import_error_the_server_came_up_after_is_not_the_diagnosis() -> None:
    """A helper process's ImportError traceback early in the log, then uvicorn up, then the worker killed: the
    worker's death is the failure, not the import."""
    real = _log("vllm", "worker-killed")
    noise = ("Traceback (most recent call last):\n  File \"<string>\", line 1, in <module>\n"
             "ModuleNotFoundError: No module named '_struct'\n")
    cut = real.index("INFO:     Started server process")
    d = diagnose(real[:cut] + noise + real[cut:], exit_code=0, engine=engine_for("vllm"))
    assert d.signature == "worker-killed"
    assert diagnose(noise, exit_code=1, engine=engine_for("vllm")).signature == "python-import-error"
