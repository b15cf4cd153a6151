"""Every failure log in tests/cases says where its text comes from, and agrees with itself."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer.engines import engine_for
from deployer.diagnose.drift import parse_args_dump

CASES = Path(__file__).parent.parent / "cases" / "sglang"
EXPECTED: dict[str, dict[str, Any]] = yaml.safe_load((CASES / "expected.yaml").read_text(encoding="utf-8"))
NUMBER = r"([0-9]+(?:\.[0-9]+)?)"

SGLANG_DUMP = engine_for("sglang").log.args_dump


def _log(name: str) -> str:
    return (CASES / f"{name}.log").read_bytes().decode("utf-8")


def test_every_log_has_an_entry_and_a_source() -> None:
    logs = {p.stem for p in CASES.glob("*.log")}
    assert logs == set(EXPECTED)
    for name, exp in EXPECTED.items():
        source = str(exp.get("source") or "")
        assert source.startswith(("real CPU run of sglang ", "assembled")), name
        assert re.search(r"0\.5\.\d+|transformers|huggingface_hub|empty log", source), name


@pytest.mark.parametrize("name", sorted(n for n, e in EXPECTED.items() if e["source"].startswith("real")))
def test_real_runs_are_the_named_release_output(name: str) -> None:
    """A real run's log carries that release's own install path and ends with its error."""
    version = re.match(r"real CPU run of sglang (\S+) ", EXPECTED[name]["source"]).group(1)  # type: ignore[union-attr]
    text = _log(name)
    venvs = ("sglang-venv-0.5.10",) if version == "0.5.10" else ("deployer/sglang-venv/", "deployer/real-sglang-venv/")
    assert any(venv in text for venv in venvs) or "usage: sglang serve" in text, name
    assert "launch_server.py" in text and "UserWarning: 'python -m sglang.launch_server' is still supported" in text
    if "usage: sglang serve" in text:                       # argparse: the full real usage, not a shortened one
        assert text.count("\n") > 300 and "                    ..." not in text


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_dump_values_agree_with_the_error(name: str) -> None:
    text = _log(name)
    dump = parse_args_dump(text, SGLANG_DUMP)
    if dump is None:
        return
    for pattern, key in ((rf"--mem-fraction-static={NUMBER}", "mem_fraction_static"),
                         (rf"mem_fraction_static={NUMBER}", "mem_fraction_static"),
                         (rf"self\.watchdog_timeout={NUMBER}", "watchdog_timeout")):
        for found in re.finditer(pattern, text):
            assert float(found.group(1)) == pytest.approx(float(dump[key])), (name, key)
    if "Raise --mem-fraction-static above" in text:
        before = float(re.search(rf"Load weight begin\. avail mem={NUMBER} GB", text).group(1))  # type: ignore[union-attr]
        after = float(re.search(rf"Load weight end\..* avail mem={NUMBER} GB", text).group(1))  # type: ignore[union-attr]
        minimum = float(re.search(rf"minimum viable = 1 - available/pre = {NUMBER}", text).group(1))  # type: ignore[union-attr]
        assert 1 - after / before == pytest.approx(minimum, abs=1e-3), name
    for found in re.finditer(rf"total capacity of {NUMBER} GiB", text):
        assert float(found.group(1)) == pytest.approx(139.81), name       # the dumps are from one H200
    if dump.get("trust_remote_code") is True:
        assert "trust_remote_code=True" not in text.split("server_args=", 1)[1], name


def test_wording_variants_across_releases_are_covered() -> None:
    """Each text the extra_buffer platform check has had is a signature pattern, and one is real output."""
    from deployer.diagnose.signatures import load_signatures

    sig = next(s for s in load_signatures(engine_for("sglang")) if s.id == "extra-buffer-unsupported-platform")
    for text in ("extra_buffer requires platform support for Mamba cache state snapshots.",
                 "Mamba extra_buffer is only supported on CUDA devices with FLA backend",
                 "extra_buffer needs CUDA/MUSA/NPU (FLA)"):
        assert sig.search(text), text
    assert "0.5.10" in sig.source and "0.5.23" in sig.source
    assert sig.search(_log("extra-buffer-unsupported-platform-seed-era"))


# --- real captures and synthetic cases (tests/cases/tools/capture_real.py, make_synthetic.py) -------------------
CASE_ROOT = Path(__file__).parent.parent / "cases"
SOURCE_LINE = re.compile(r"[\w/.-]+\.(?:py|cpp|hpp|cc|h|so)(?::\d+)?")
REAL_KEYS = {"kind", "release", "command", "env", "date", "exit_code", "how", "tool"}


def _expected(engine: str) -> dict[str, dict[str, Any]]:
    return yaml.safe_load((CASE_ROOT / engine / "expected.yaml").read_text(encoding="utf-8"))


def _provenances() -> list[tuple[str, str, dict[str, Any]]]:
    return [(engine, name, exp["provenance"]) for engine in ("vllm", "sglang")
            for name, exp in _expected(engine).items() if "provenance" in exp]


def test_every_vllm_case_is_a_real_capture_or_says_it_is_synthetic() -> None:
    expected = _expected("vllm")
    assert {p.stem for p in (CASE_ROOT / "vllm").glob("*.log")} == set(expected)
    kinds = {name: exp["provenance"]["kind"] for name, exp in expected.items()}
    assert set(kinds.values()) <= {"real CPU capture", "synthetic"}, kinds
    assert sum(k == "real CPU capture" for k in kinds.values()) >= 12
    for name, exp in expected.items():
        prov = exp["provenance"]
        if prov["kind"] == "synthetic":
            assert SOURCE_LINE.search(prov["source"]), (name, prov["source"])   # the file:line of the text it copies
            assert prov["how"], name


@pytest.mark.parametrize("engine, name, prov", [p for p in _provenances() if p[2]["kind"] == "real CPU capture"],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_a_real_capture_carries_its_provenance_and_is_that_release_output(engine: str, name: str,
                                                                          prov: dict[str, Any]) -> None:
    assert REAL_KEYS <= set(prov), (name, sorted(REAL_KEYS - set(prov)))
    assert re.match(r"(vllm 0\.32\.0|sglang 0\.5\.23) ", prov["release"]), prov["release"]
    assert prov["command"].startswith(f"python -m {'vllm.entrypoints.openai.api_server' if engine == 'vllm' else 'sglang.launch_server'} ")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", str(prov["date"]))
    assert prov["tool"] == "tests/cases/tools/capture_real.py"
    text = (CASE_ROOT / engine / f"{name}.log").read_bytes().decode("utf-8")
    # the real install's own paths are in the log: the real venvs, not a stand-in's site-packages
    assert f"real-{engine}-venv/lib/python" in text, name
    assert "STAND-IN" not in text and "stand-in" not in text.lower().replace("sgl_kernel stand-in", ""), name
    # the expectation diagnoses the log with the exit code the capture saw
    assert _expected(engine)[name].get("exit_code") == prov["exit_code"], name
