"""The stand-in engines (tests/standin/vllm, tests/standin/sglang) against the REAL engines' captures
(tests/cases/*/, made by tests/cases/tools/capture_real.py from real vLLM 0.32.0 CPU and real SGLang 0.5.23):
the same line shapes (logger prefixes, uvicorn's lines), the same startup phases under deployer's LogFormat.phases,
the same ready line, the same engine told from the log, and the same diagnosis and remedy for the same scenario, so
the fast tier (which runs only the stand-ins) cannot drift from reality again.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer.diagnose.diagnosis import diagnose
from deployer.engines import detect_kind
from deployer.engines import engine_for

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "cases"
STANDIN = ROOT / "tests" / "standin"
MODULE = {"vllm": "vllm.entrypoints.openai.api_server", "sglang": "sglang.launch_server"}
# the target's system python, as the integration tests run the stand-ins (their titled child processes, argv[0]
# `VLLM::EngineCore`, find the standard library only from a python's compiled-in prefix, not a venv's)
PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable

# Line shapes, as the real captures print them.
VLLM_LOGGER = re.compile(r"^\((?P<tag>[A-Za-z][\w-]*) pid=\d+\) (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                         r"\d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+:\d+\] ")
SGLANG_STAMP = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: (?:TP|DP|PP|EP)\d+(?: \w+\d+)*)?\] ")
UVICORN = re.compile(r"^(?:\[[^\]]+\] )?(?:INFO|WARNING|ERROR): {1,5}\S")


def _real(engine: str, name: str) -> str:
    return (CASES / engine / f"{name}.log").read_bytes().decode("utf-8")


def _expected(engine: str) -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = yaml.safe_load((CASES / engine / "expected.yaml").read_text(encoding="utf-8"))
    return data


def _standin(engine: str, argv: list[str], env: dict[str, str] | None = None, until: str | None = None,
             timeout: float = 30) -> tuple[str, int | None]:
    """Run the stand-in engine; until: stop it (SIGTERM) once this text is in its output."""
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(STANDIN), "STANDIN_STEP_S": "0",
            "PYTHONDONTWRITEBYTECODE": "1",
            "STANDIN_READY_DELAY_S": "0", "STANDIN_DRAIN_S": "0", **(env or {})}
    proc = subprocess.Popen([PYTHON, "-m", MODULE[engine], *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=full, cwd="/", start_new_session=True)
    assert proc.stdout is not None
    out = b""
    os.set_blocking(proc.stdout.fileno(), False)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            chunk = proc.stdout.read() or b""
            out += chunk
            if until is not None and until.encode() in out:
                proc.terminate()
                proc.wait(10)
                out += proc.stdout.read() or b""
                return out.decode("utf-8", "replace"), proc.returncode
            if proc.poll() is not None:
                out += proc.stdout.read() or b""
                return out.decode("utf-8", "replace"), proc.returncode
            time.sleep(0.02)
        raise AssertionError(f"stand-in {engine} did not finish: {out[-2000:]!r}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()


def _vllm_argv(*extra: str) -> list[str]:
    model = ROOT / "tests" / "fixtures" / "models" / "qwen3-8b"
    where = str(model) if model.is_dir() else "Qwen/Qwen3-8B"
    return ["--model", where, "--host", "127.0.0.1", "--port", "0", "--enforce-eager", *extra]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sglang_argv(*extra: str) -> list[str]:
    # --device cpu as the real capture ran (the stand-in then captures no CUDA graphs, as the real CPU engine)
    return ["--model-path", "Qwen/Qwen3-8B", "--device", "cpu", "--host", "127.0.0.1", "--port", str(_free_port()),
            *extra]


def _logger_lines(text: str, engine: str) -> list[str]:
    """Lines that carry the engine's own logger prefix (after any \\r redraws)."""
    shape = VLLM_LOGGER if engine == "vllm" else SGLANG_STAMP
    return [ln for raw in text.split("\n") for ln in raw.split("\r") if shape.match(ln)]


def _tags(text: str) -> set[str]:
    return {m.group("tag") for m in map(VLLM_LOGGER.match, text.replace("\r", "\n").split("\n")) if m}


@pytest.fixture(scope="module")
def vllm_good() -> str:
    text, _ = _standin("vllm", _vllm_argv(), until="Application startup complete.")
    return text


@pytest.fixture(scope="module")
def sglang_good() -> str:
    text, _ = _standin("sglang", _sglang_argv(), until="The server is fired up and ready to roll!")
    return text


def test_the_real_captures_have_the_shapes_this_test_checks() -> None:
    """The shapes below are the real engines' (so the stand-in is held to reality, not to itself)."""
    real = _real("vllm", "good-startup")
    assert len(_logger_lines(real, "vllm")) > 50
    assert {"APIServer", "EngineCore", "Worker"} <= _tags(real)
    assert "\nINFO:     Application startup complete.\n" in real   # uvicorn's own line, no logger prefix
    # every line that looks like vLLM's logger prefix is exactly its shape (and the spec's prefix strips it)
    for line in real.split("\n"):
        if " pid=" in line and line.startswith("("):
            assert VLLM_LOGGER.match(line), line
            assert engine_for("vllm").log.prefix.match(line)  # type: ignore[union-attr]
    sg = _real("sglang", "good-startup")
    assert len(_logger_lines(sg, "sglang")) > 20
    assert re.search(r"^\[[^\]]+\] INFO:     Uvicorn running on http://", sg, re.M)  # uvicorn under SGLang's stamp


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_stand_in_goes_through_the_real_startup_phases(engine: str, vllm_good: str, sglang_good: str) -> None:
    spec = engine_for(engine)
    real = spec.log.phases_in(_real(engine, "good-startup"))
    assert real == _expected(engine)["good-startup"]["phases"]
    standin = spec.log.phases_in(vllm_good if engine == "vllm" else sglang_good)
    assert standin == real, (engine, standin, real)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_ready_line_is_the_real_one(engine: str, vllm_good: str, sglang_good: str) -> None:
    spec = engine_for(engine)
    real = [ln for ln in _real(engine, "good-startup").split("\n") if spec.log.ready_line in ln]
    standin = [ln for ln in (vllm_good if engine == "vllm" else sglang_good).split("\n") if spec.log.ready_line in ln]
    assert len(real) == 1 and len(standin) == 1
    strip = (lambda s: SGLANG_STAMP.sub("", s)) if engine == "sglang" else (lambda s: s)
    assert strip(standin[0]) == strip(real[0])          # same words, same (un)prefixed form


def test_the_stand_in_vllm_prints_the_real_line_shapes(vllm_good: str) -> None:
    lines = vllm_good.replace("\r", "\n").split("\n")
    logger = [ln for ln in lines if ln.startswith("(") and " pid=" in ln]
    assert logger and all(VLLM_LOGGER.match(ln) for ln in logger), [ln for ln in logger if not VLLM_LOGGER.match(ln)]
    assert _tags(vllm_good) <= _tags(_real("vllm", "good-startup")) | {"Worker_TP0", "Worker_TP1"}
    for line in lines:                                   # uvicorn's lines: as the real ones, never logger-prefixed
        if re.match(r"^INFO: ", line):
            assert UVICORN.match(line), line
    assert detect_kind(vllm_good) == "vllm"


def test_the_stand_in_sglang_prints_the_real_line_shapes(sglang_good: str) -> None:
    for line in sglang_good.split("\n"):
        if line.startswith("[20"):
            assert SGLANG_STAMP.match(line), line
    assert re.search(r"^\[[^\]]+\] INFO:     Uvicorn running on http://", sglang_good, re.M)
    assert "server_args=" in sglang_good and detect_kind(sglang_good) == "sglang"


# The same failure on the stand-in and on the real engine: the same diagnosis, the same remedy, the same shapes.
VLLM_SCENARIOS = {
    "kv-cache-too-small": (["--max-model-len", "40960"], {"STANDIN_GPU_GB": "23.5"}),
    "max-model-len-above-derived": (["--max-model-len", "100000"], {}),
    "unrecognized-arguments": (["--not-a-flag"], {}),
    "invalid-choice": (["--dtype", "bf16"], {}),
}


@pytest.mark.parametrize("name", sorted(VLLM_SCENARIOS))
def test_a_vllm_failure_reads_the_same_on_the_stand_in_and_the_real_engine(name: str) -> None:
    argv, env = VLLM_SCENARIOS[name]
    standin, code = _standin("vllm", _vllm_argv(*argv), env)
    real = _real("vllm", name)
    exp = _expected("vllm")[name]
    assert code == exp["exit_code"]
    assert detect_kind(standin) == detect_kind(real) == "vllm"
    got, want = (diagnose(t, exit_code=exp["exit_code"], engine=engine_for("vllm")) for t in (standin, real))
    assert got.signature == want.signature == exp["signature"]
    remedy = got.to_json()["remedy"]
    assert (remedy is None) == (exp["remedy"] is None)
    if remedy is not None:
        assert set(remedy["args"]) == set(exp["remedy"]["args"]) and set(remedy["env"]) == set(exp["remedy"]["env"])
    # the root cause's lines: prefixed by the same process, re-prefixed after \r\n the same way
    for text in (standin, real):
        if "Traceback" in text and exp.get("rank") == "EngineCore":
            assert re.search(r"^\(EngineCore pid=\d+\) ERROR [^\n]*\] Traceback \(most recent call last\):\r$", text, re.M)
    if "usage: " in real:
        assert re.search(r"^usage: api_server\.py ", standin, re.M) and re.search(r"^usage: api_server\.py ", real, re.M)
        assert re.search(r"^api_server\.py: error: ", standin, re.M)


def test_a_worker_killed_while_serving_reads_the_same_on_the_stand_in_and_the_real_engine() -> None:
    """Real 0.32.0: the worker SIGKILLed after ready -> 'died unexpectedly (exit code: -9)', the EngineCore's
    'Executor failed.', the API server's EngineDeadError, and exit 0 (a supervisor must not trust it)."""
    standin, code = _standin("vllm", _vllm_argv(), {"STANDIN_MODE": "worker_killed_after_ready",
                                                   "STANDIN_CRASH_AFTER_S": "0.05"})
    real = _real("vllm", "worker-killed")
    exp = _expected("vllm")["worker-killed"]
    assert code == exp["exit_code"] == exp["provenance"]["exit_code"] == 0
    got, want = (diagnose(t, exit_code=0, engine=engine_for("vllm")) for t in (standin, real))
    assert got.signature == want.signature == "worker-killed" and got.summary == want.summary
    for text in (standin, real):
        assert re.search(r"^\(EngineCore pid=\d+\) ERROR [^\n]*\[multiproc_executor\.py:\d+\] Worker proc VllmWorker-0 "
                         r"died unexpectedly \(exit code: -9\), shutting down executor\.$", text, re.M)
        assert re.search(r"^\(APIServer pid=\d+\) ERROR [^\n]*\] vllm\.v1\.engine\.exceptions\.EngineDeadError: ", text, re.M)
        assert engine_for("vllm").log.phases_in(text)[-1] == "ready"


@pytest.mark.parametrize("behaviour", ["exit", "hang"])
def test_a_taken_port_reads_the_same_on_the_stand_in_sglang_and_the_real_one(behaviour: str) -> None:
    """Real SGLang 0.5.23 logs uvicorn's bind error under its stamp and hangs for good; the stand-in prints the same
    lines, and hangs too with STANDIN_BIND_FAILURE=hang (by default it exits 1: today's supervisor tests rely on it)."""
    real = _real("sglang", "real-port-in-use")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        argv = ["--model-path", "Qwen/Qwen3-8B", "--device", "cpu", "--host", "127.0.0.1", "--port", str(port)]
        if behaviour == "exit":
            standin, code = _standin("sglang", argv)
            assert code == 1
        else:
            with pytest.raises(AssertionError, match="did not finish"):
                _standin("sglang", argv, {"STANDIN_BIND_FAILURE": "hang"}, timeout=3)
            return
    bind = re.compile(r"^\[[^\]]+\] ERROR: {4}\[Errno 98\] error while attempting to bind on address "
                      r"\('127\.0\.0\.1', \d+\): address already in use\n\[[^\]]+\] INFO: {5}Waiting for application "
                      r"shutdown\.$", re.M)
    assert bind.search(real) and bind.search(standin)
    got, want = (diagnose(t, exit_code=1, engine=engine_for("sglang")) for t in (standin, real))
    assert got.signature == want.signature == "port-in-use"


def test_an_unknown_flag_reads_the_same_on_the_stand_in_sglang_and_the_real_one() -> None:
    real = _real("sglang", "real-unrecognized-arguments")
    standin, code = _standin("sglang", _sglang_argv("--not-a-flag"))
    assert code == _expected("sglang")["real-unrecognized-arguments"]["exit_code"] == 2
    for text in (real, standin):
        assert re.search(r"^usage: sglang serve \[-h\]", text, re.M)
        assert re.search(r"^sglang serve: error: unrecognized arguments: --not-a-flag$", text, re.M)
        assert detect_kind(text) == "sglang"
    got, want = (diagnose(t, exit_code=2, engine=engine_for("sglang")) for t in (standin, real))
    assert got.signature == want.signature == "unrecognized-arguments" and got.summary == want.summary
