"""deployer.prepare.diagnose_install: every real pip/uv failure in tests/cases/install is said in one line by the
entry expected.yaml names; every entry is backed by a real capture; an unknown failure is never a traceback."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer.prepare.diagnose_install import diagnose_install, load_failures

CASES = Path(__file__).parent.parent / "cases" / "install"
EXPECTED: dict[str, dict[str, Any]] = yaml.safe_load((CASES / "expected.yaml").read_text(encoding="utf-8"))
FAILED = sorted(n for n, e in EXPECTED.items() if "diagnosis" in e)


def _text(name: str) -> str:
    return (CASES / f"{name}.txt").read_text(encoding="utf-8")


def test_every_case_has_an_entry_and_a_real_source() -> None:
    assert {p.stem for p in CASES.glob("*.txt")} == set(EXPECTED)
    for name, exp in EXPECTED.items():
        assert re.match(r"real run of (pip \d+\.\d+\.\d+|uv \d+\.\d+\.\d+) \(Python 3\.\d+\.\d+", exp["source"]), name
        assert name.split("-")[0] in exp["source"].split(" ")[3], name          # the file's tool ran it
        assert (exp["exit"] == 0) == ("diagnosis" not in exp), name


@pytest.mark.parametrize("name", FAILED)
def test_each_real_failure_in_one_line(name: str) -> None:
    tool = name.split("-")[0]
    diagnosis = diagnose_install(_text(name), tool)
    assert diagnosis.id == EXPECTED[name]["diagnosis"], diagnosis.line
    assert "\n" not in diagnosis.line and "Traceback" not in diagnosis.line and len(diagnosis.line) < 400
    assert "?" not in diagnosis.summary.split(":")[0] or "?" in _text(name)   # every {group} was filled


def test_the_lines_say_what_the_output_says() -> None:
    assert diagnose_install(_text("pip-no-such-version"), "pip").summary == (
        "six==99.0: no such version for this Python and platform "
        "(the indexes have ..., 1.12.0, 1.13.0, 1.14.0, 1.15.0, 1.16.0, 1.17.0)")
    assert diagnose_install(_text("pip-requires-python"), "pip").summary == (
        "numpy==1.21.6 needs Python >=3.7,<3.11, not the environment's Python")
    assert "[Errno 111] Connection refused" in diagnose_install(_text("pip-index-unreachable"), "pip").summary
    assert "http://127.0.0.1:9/simple/six/" in diagnose_install(_text("uv-index-unreachable"), "uv").summary
    assert "(torch<=2.14.1)" in diagnose_install(_text("pip-constraint-cap"), "pip").summary
    assert "requests 2.31.0 depends on urllib3<3 and >=1.21.1" in diagnose_install(_text("pip-conflict"), "pip").summary


def test_every_entry_is_backed_by_a_capture_it_matches() -> None:
    for failure in load_failures():
        files = re.findall(r"[a-z0-9-]+\.txt", failure.source)
        assert files, failure.id
        for file in files:
            assert (CASES / file).is_file(), (failure.id, file)
        assert any(failure.match(_text(f[:-4])) is not None for f in files), failure.id


def test_an_unknown_failure_is_its_last_error_line_not_a_traceback() -> None:
    pip_out = ("Collecting x\nERROR: Exception:\nTraceback (most recent call last):\n  File \"a.py\", line 1\n"
               "OSError: [Errno 5] Input/output error\nERROR: Could not install packages due to an OSError: "
               "[Errno 5] Input/output error\n")
    got = diagnose_install(pip_out, "pip")
    assert got.id == "unknown"
    assert got.line == "pip failed: Could not install packages due to an OSError: [Errno 5] Input/output error"
    uv_out = "error: Failed to prepare distributions\n  cause: Failed to fetch wheel: x\n  cause: Something new\n"
    assert diagnose_install(uv_out, "uv").line == "uv failed: Something new"
    assert diagnose_install("", "uv").line == "uv failed: no output"


def test_tool_specific_entries_do_not_cross() -> None:
    """uv's text read as pip's (or the reverse) falls to the generic line: the entries are per tool."""
    assert diagnose_install(_text("uv-no-such-version"), "pip").id == "unknown"
    assert diagnose_install(_text("pip-no-such-version"), "uv").id == "unknown"


def test_an_unknown_failure_skips_pips_list_of_versions_ignored_for_python() -> None:
    """pip prints the versions it skipped for the Python as an ERROR line before the one that says what failed."""
    text = ("ERROR: Ignored the following versions that require a different python version: 0.52.0 Requires-Python "
            ">=3.6,<3.9\nERROR: something new went wrong\n")
    assert diagnose_install(text, "pip").summary == "pip failed: something new went wrong"
