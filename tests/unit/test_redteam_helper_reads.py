"""Red team, issue #34: the helper's read-only ops (`read`, `size`, `listdir`, `find_bytes`) reach their path a
component at a time without the kernel following links, as its writes do (files.open_to_read).

Another user (the real `nobody`) plants a symlink in a sticky world-writable directory (as /tmp is) where deployer
reads: the read is refused in one line naming the link and its owner, instead of returning what root's path leads
to. The last component is never followed, whoever owns the link; deployer's own links on the way still are."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from test_supervise_helper import Helper, helper  # noqa: F401 (the fixture: one helper process per test)

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's link needs root")


def _arena(tmp_path: Path) -> tuple[Path, Path]:
    """(a sticky world-writable dir, as /tmp is; root's private dir holding a secret log and a runs dir)."""
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    private = tmp_path / "private"
    (private / "runs" / "r1").mkdir(parents=True)
    (private / "engine.log").write_bytes(b"root's secret log line\n")
    private.chmod(0o700)
    return sticky, private


def _nobodys_link(at: Path, target: Path) -> None:
    at.symlink_to(target)
    os.lchown(at, NOBODY, NOBODY)


def test_reads_through_another_users_link_are_refused_naming_it_and_its_owner(helper: Helper, tmp_path: Path) -> None:
    sticky, private = _arena(tmp_path)
    _nobodys_link(sticky / "work", private)
    log = str(sticky / "work" / "engine.log")
    for op, fields in (("read", {"path": log, "offset": 0, "limit": 100}), ("size", {"path": log}),
                       ("listdir", {"path": str(sticky / "work" / "runs")}),
                       ("find_bytes", {"path": log, "needle_b64": base64.b64encode(b"secret").decode()})):
        reply = helper.ask(op, **fields)
        assert not reply["ok"] and reply["kind"] == "unsafe", (op, reply)
        said = reply["error"]
        assert "\n" not in said and str(sticky / "work") in said and "nobody" in said, (op, said)


def test_the_last_component_is_never_followed_whoever_owns_the_link(helper: Helper, tmp_path: Path) -> None:
    _, private = _arena(tmp_path)
    (private / "state.json").symlink_to(private / "engine.log")  # root's own link: still not read through
    reply = helper.ask("read", path=str(private / "state.json"), offset=0, limit=100)
    assert not reply["ok"] and reply["kind"] == "unsafe" and "symbolic link" in reply["error"], reply
    os.mkfifo(private / "fifo")  # a planted FIFO is no file: refused at once, never waited on
    reply = helper.ask("read", path=str(private / "fifo"), offset=0, limit=100)
    assert not reply["ok"] and reply["kind"] == "unsafe", reply


def test_plain_reads_and_our_own_links_on_the_way_still_work(helper: Helper, tmp_path: Path) -> None:
    sticky, private = _arena(tmp_path)
    (private / "current").symlink_to("runs/r1")  # deployer's own `current`
    (private / "runs" / "r1" / "state.json").write_bytes(b'{"status": "ready"}')
    got = helper.ask("read", path=str(private / "current" / "state.json"), offset=0, limit=100)
    assert got["ok"] and base64.b64decode(got["data_b64"]) == b'{"status": "ready"}', got
    assert helper.ask("read", path=str(private / "engine.log"), offset=5, limit=6)["data_b64"] == \
        base64.b64encode(b"s secr").decode()
    assert helper.ask("size", path=str(private / "engine.log"))["size"] == len(b"root's secret log line\n")
    assert helper.ask("size", path=str(private / "none"))["size"] is None
    missing = helper.ask("read", path=str(private / "none"), offset=0, limit=1)
    assert not missing["ok"] and missing["kind"] == "notfound"
    assert helper.ask("listdir", path=str(private / "runs"))["names"] == ["r1"]
    (sticky / "mine").symlink_to(private)  # a link of ours in a sticky dir: followed (no one else can replace it)
    assert helper.ask("listdir", path=str(sticky / "mine" / "runs"))["names"] == ["r1"]
