"""Unit tests of the supervisor's safety rules for what deployer creates on the target (base): directory
chains no other user controls, files never opened through a symlink."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from deployer.supervisor import base

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="handing a directory to another user needs root")


def test_make_dirs_creates_the_missing_dirs_private(tmp_path: Path) -> None:
    target = tmp_path / "w" / "demo" / "runs"
    base.make_dirs(str(target), str(tmp_path / "w" / "demo"))
    assert target.is_dir() and (target.stat().st_mode & 0o777) == 0o700
    base.make_dirs(str(target), str(tmp_path / "w" / "demo"))  # again: nothing to do, nothing refused


def test_a_sticky_shared_ancestor_is_fine_a_plain_shared_one_is_not(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    base.make_dirs(str(shared / "w" / "demo"), str(shared / "w" / "demo"))
    shared.chmod(0o777)
    with pytest.raises(base.UnsafePath, match=f"{shared} is writable by everyone without the sticky bit"):
        base.make_dirs(str(shared / "w" / "demo"), str(shared / "w" / "demo"))


def test_the_deployment_dir_must_be_ours_alone(tmp_path: Path) -> None:
    demo = tmp_path / "demo"
    demo.mkdir()
    demo.chmod(0o1777)  # sticky does not make a deployer-owned dir safe: others could plant files in it
    with pytest.raises(base.UnsafePath, match="is writable by everyone: another user could plant files in it"):
        base.make_dirs(str(demo / "runs"), str(demo))


@needs_root
def test_a_dir_owned_by_another_user_is_refused_as_an_ancestor_or_our_own(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(base.UnsafePath, match=f"{theirs} is owned by nobody, not root"):
        base.make_dirs(str(theirs / "demo"), str(theirs / "demo"))
    assert not (theirs / "demo").exists()  # refused before anything was created


@needs_root
def test_a_symlink_is_judged_where_it_leads(tmp_path: Path) -> None:
    """A workdir reached through a symlink: the directories it leads to are checked too."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "w").mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    (tmp_path / "link").symlink_to(theirs / "w")
    with pytest.raises(base.UnsafePath, match=f"{theirs} is owned by nobody"):
        base.make_dirs(str(tmp_path / "link" / "demo"), str(tmp_path / "link" / "demo"))


def test_open_file_never_follows_a_symlink_nor_opens_a_fifo(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "lock").symlink_to(victim)
    with pytest.raises(base.UnsafePath, match="is a symbolic link"):
        base.open_file(str(tmp_path / "lock"), os.O_RDWR | os.O_CREAT, 0o644, "lock")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(base.UnsafePath, match="is not a regular file"):
        base.open_file(str(tmp_path / "fifo"), os.O_RDWR, 0o644, "lock")
    fd = base.open_file(str(tmp_path / "new"), os.O_RDWR | os.O_CREAT, 0o644, "lock")
    os.close(fd)
    assert victim.read_text() == "keep"


def test_write_json_replaces_a_planted_temp_link_instead_of_following_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / f"state.json.tmp.{os.getpid()}").symlink_to(victim)
    base.write_json(str(tmp_path / "state.json"), {"ok": True})
    assert victim.read_text() == "keep" and (tmp_path / "state.json").read_text() == '{"ok": true}\n'


def test_a_link_at_or_below_owned_from_is_refused_even_ours(tmp_path: Path) -> None:
    """Issue 34: at or below the deployment dir no link is followed, whoever made it."""
    (tmp_path / "real").mkdir()
    (tmp_path / "w").symlink_to(tmp_path / "real")
    with pytest.raises(base.UnsafePath, match=f"{tmp_path}/w is a symbolic link \\(owned by "):
        base.make_dirs(str(tmp_path / "w" / "demo"), str(tmp_path / "w"))
    assert os.listdir(tmp_path / "real") == []


def test_our_link_above_owned_from_is_followed_and_open_dir_holds_where_it_led(tmp_path: Path) -> None:
    (tmp_path / "real" / "demo").mkdir(parents=True)
    (tmp_path / "w").symlink_to(tmp_path / "real")
    fd = base.open_dir(str(tmp_path / "w" / "demo"), str(tmp_path / "w" / "demo"))
    try:
        (tmp_path / "w").unlink()
        (tmp_path / "w").symlink_to(tmp_path)   # re-pointed: the descriptor still holds the directory checked
        st = os.fstat(fd)
        assert (st.st_dev, st.st_ino) == (os.stat(tmp_path / "real" / "demo").st_dev,
                                          os.stat(tmp_path / "real" / "demo").st_ino)
    finally:
        os.close(fd)
    with pytest.raises(FileNotFoundError):
        base.open_dir(str(tmp_path / "nope"), str(tmp_path / "nope"))


@needs_root
def test_another_users_link_above_owned_from_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "w").symlink_to(tmp_path / "real")
    os.lchown(tmp_path / "w", NOBODY, NOBODY)
    with pytest.raises(base.UnsafePath, match=f"{tmp_path}/w is a symbolic link owned by nobody, not root"):
        base.make_dirs(str(tmp_path / "w" / "demo" / "runs"), str(tmp_path / "w" / "demo"))
    assert os.listdir(tmp_path / "real") == []
