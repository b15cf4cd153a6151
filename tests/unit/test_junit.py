"""JUnit XML writer: structure and counts CI reporters read, any text survives, atomic writes."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deployer.output.junit import Case, Suite, to_xml, write, xml_safe


def suite_of(*cases: Case) -> Suite:
    return Suite(name="deploy smoke demo", cases=list(cases), properties={"host": "root@gpu-box"})


def test_counts_statuses_and_times() -> None:
    xml = to_xml([suite_of(
        Case("preflight", "smoke.demo", 0.5),
        Case("start", "smoke.demo", 1.25, "failed", message="engine died\nsecond line", text="long\ntext",
             kind="LaunchFailed"),
        Case("ready", "smoke.demo", status="skipped", message="not reached"),
        Case("stop", "smoke.demo", 0.1, "error", message="boom"),
    )])
    root = ET.fromstring(xml)
    suite = root.find("testsuite")
    assert suite is not None
    for el in (root, suite):
        assert (el.get("tests"), el.get("failures"), el.get("errors"), el.get("skipped")) == ("4", "1", "1", "1")
        assert el.get("time") == "1.850"
    start = suite.find("testcase[@name='start']")
    assert start is not None and start.get("time") == "1.250" and start.get("classname") == "smoke.demo"
    failure = start.find("failure")
    assert failure is not None
    assert failure.get("message") == "engine died second line"   # one line
    assert failure.get("type") == "LaunchFailed" and failure.text == "long\ntext"
    skipped = suite.find("testcase[@name='ready']/skipped")
    assert skipped is not None and skipped.get("message") == "not reached"
    assert suite.find("testcase[@name='preflight']/*") is None
    prop = suite.find("properties/property")
    assert prop is not None and (prop.get("name"), prop.get("value")) == ("host", "root@gpu-box")


def test_unknown_status_is_refused() -> None:
    with pytest.raises(ValueError, match="status must be one of"):
        Case("x", "y", status="ok")


def test_control_characters_are_shown_not_dropped() -> None:
    assert xml_safe("\x1b[31mred\x1b[0m\x00") == "\\x1b[31mred\\x1b[0m\\x00"
    assert xml_safe("tab\tnew\nline\r ü 日本") == "tab\tnew\nline\r ü 日本"


@settings(max_examples=150, deadline=None)
@given(st.text(), st.text(max_size=50))
def test_any_text_gives_a_file_that_parses(text: str, name: str) -> None:
    xml = to_xml([suite_of(Case(name, "smoke", 1.0, "failed", message=text, text=text, stdout=text))])
    case = ET.fromstring(xml).find("testsuite/testcase")
    assert case is not None and case.get("name") == xml_safe(name)
    failure = case.find("failure")
    assert failure is not None
    # what a reader gets back is what was written, less XML's end-of-line normalisation of CR
    assert (failure.text or "") == xml_safe(text).replace("\r\n", "\n").replace("\r", "\n")


def test_write_is_atomic_and_replaces(tmp_path: Path) -> None:
    dest = tmp_path / "reports" / "smoke.xml"
    write(dest, [suite_of(Case("a", "b"))])
    first = dest.read_bytes()
    write(dest, [suite_of(Case("a", "b", status="failed", message="m"))])
    assert dest.read_bytes() != first and b"<failure" in dest.read_bytes()
    assert [p.name for p in dest.parent.iterdir()] == ["smoke.xml"]           # no temp file left behind
    assert first.startswith(b"<?xml version='1.0' encoding='utf-8'?>")
