"""JUnit XML (the dialect CI systems read: Jenkins, GitHub Actions reporters, GitLab) with stdlib ElementTree.

    <testsuites tests= failures= errors= skipped= time=>
      <testsuite name= tests= failures= errors= skipped= time= timestamp= hostname=>
        <properties><property name= value=/></properties>
        <testcase classname= name= time=>
          <failure message="one line" type="...">long text</failure>  |  <skipped message=".."/>
          <system-out>details</system-out>
        </testcase>

XML 1.0 cannot carry most control characters (engine logs are full of ANSI escapes), so every text and
attribute goes through `xml_safe` first: the file always parses.
"""

from __future__ import annotations

import os
import re
import socket
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from deployer.secrets import mask_text
from deployer.smoke import Smoked

STATUSES = ("passed", "failed", "error", "skipped")
_INVALID_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff\ufffe\uffff]")
MESSAGE_MAX = 500


def xml_safe(text: str) -> str:
    """`text` with the characters XML 1.0 cannot hold shown as \\xNN (ESC -> \\x1b), everything else kept."""
    return _INVALID_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", mask_text(text))


@dataclass(frozen=True)
class Case:
    """One testcase. `message` is the one-line reason of a failure or skip; `text` its long form."""

    name: str
    classname: str
    time_s: float = 0.0
    status: str = "passed"
    message: str = ""
    text: str = ""
    kind: str = ""  # the failure's type attribute (e.g. the error class)
    stdout: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {self.status!r}")


@dataclass(frozen=True)
class Suite:
    name: str
    cases: list[Case]
    properties: dict[str, str] = field(default_factory=dict)
    timestamp: datetime | None = None

    def count(self, status: str) -> int:
        return sum(c.status == status for c in self.cases)

    @property
    def time_s(self) -> float:
        return sum(c.time_s for c in self.cases)


def _case_element(case: Case) -> ET.Element:
    el = ET.Element("testcase", classname=xml_safe(case.classname), name=xml_safe(case.name),
                    time=f"{max(case.time_s, 0.0):.3f}")
    message = xml_safe(" ".join(case.message.split())[:MESSAGE_MAX])
    if case.status in ("failed", "error"):
        tag = "failure" if case.status == "failed" else "error"
        child = ET.SubElement(el, tag, message=message, type=xml_safe(case.kind or tag))
        child.text = xml_safe(case.text or case.message)
    elif case.status == "skipped":
        ET.SubElement(el, "skipped", message=message)
    if case.stdout:
        ET.SubElement(el, "system-out").text = xml_safe(case.stdout)
    return el


def suite_element(suite: Suite) -> ET.Element:
    when = suite.timestamp or datetime.now(timezone.utc)
    el = ET.Element("testsuite", name=xml_safe(suite.name), tests=str(len(suite.cases)),
                    failures=str(suite.count("failed")), errors=str(suite.count("error")),
                    skipped=str(suite.count("skipped")), time=f"{suite.time_s:.3f}",
                    timestamp=when.strftime("%Y-%m-%dT%H:%M:%S"), hostname=xml_safe(socket.gethostname()))
    if suite.properties:
        props = ET.SubElement(el, "properties")
        for key, value in suite.properties.items():
            ET.SubElement(props, "property", name=xml_safe(key), value=xml_safe(value))
    for case in suite.cases:
        el.append(_case_element(case))
    return el


def to_xml(suites: list[Suite]) -> bytes:
    root = ET.Element("testsuites", tests=str(sum(len(s.cases) for s in suites)),
                      failures=str(sum(s.count("failed") for s in suites)),
                      errors=str(sum(s.count("error") for s in suites)),
                      skipped=str(sum(s.count("skipped") for s in suites)),
                      time=f"{sum(s.time_s for s in suites):.3f}")
    root.extend(suite_element(s) for s in suites)
    ET.indent(root)
    data: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return data + b"\n"


def write(path: str | os.PathLike[str], suites: list[Suite]) -> Path:
    """Write the file atomically (temp file in the same folder, then rename): a reader never sees half of it."""
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(to_xml(suites))
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest


def smoke_suite(report: Smoked, profile_path: str) -> Suite:
    """The JUnit suite of any smoke (single host, node group, fleet): a testcase per case of the report."""
    error = report.error
    cases = [Case(name=c.name, classname=c.classname, time_s=c.duration_s, status=c.status, message=c.details,
                  text=c.text, kind=type(error).__name__ if c.status == "failed" and error else "",
                  stdout=c.details if c.status == "passed" else "")
             for c in report.smoke_cases()]
    return Suite(name=f"deploy smoke {report.name}".strip(), cases=cases,
                 properties={"profile": profile_path, **report.properties()})
