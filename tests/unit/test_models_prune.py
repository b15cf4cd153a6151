"""push.models_prune, the helper's retention of pushed model directories (`engine.weights.push`): what
no kept run loads goes (its directory, staging, chunks and record), unless it was pushed or reused lately or a push
of it runs now; `dry` only says; a shared (hard-linked) file frees nothing and is not counted; nothing is followed
through a symlink."""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

import pytest

from deployer.supervisor.base import UnsafePath
from deployer.supervisor.fetch import FetchError
from deployer.supervisor.push import models_prune

DAY = 24 * 3600.0


def content(n: int) -> str:
    return f"{n:064x}"


def pushed(models: Path, c: str, size: int, age_s: float = 2 * DAY) -> Path:
    """A content as a finished push leaves it: the directory and its record, last used `age_s` ago."""
    folder = models / c
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "model.safetensors").write_bytes(b"w" * size)
    record = models / f".{c}.verified.json"
    record.write_text("{}")
    then = time.time() - age_s
    for p in (folder / "sub" / "model.safetensors", folder / "sub", folder, record):
        os.utime(p, (then, then), follow_symlinks=False)
    return folder


def ask(work: Path, keep: list[str], dry: bool = False, going: list[str] | None = None) -> dict[str, object]:
    """models_prune with a run of a deployment `dep` in the workdir for each content in `keep` (its profile.json
    loads it, as a pushed run's does)."""
    models = work / ".deployer" / "models"
    for index, c in enumerate(keep):
        run = work / "dep" / "runs" / f"r{index}"
        run.mkdir(parents=True, exist_ok=True)
        (run / "profile.json").write_text(json.dumps({"profile": {"engine": {"model_path": f"{models}/{c}"}}}))
    return models_prune({"models": str(models), "owned_from": str(work), "going": going or [],
                         "min_age_s": DAY, "dry": dry})


@pytest.fixture()
def work(tmp_path: Path) -> Path:
    (tmp_path / "work" / ".deployer" / "models").mkdir(parents=True, mode=0o700)
    return tmp_path / "work"


def test_what_no_kept_run_loads_goes_what_one_loads_or_was_used_lately_stays(work: Path) -> None:
    models = work / ".deployer" / "models"
    kept, old, recent = content(1), content(2), content(3)
    pushed(models, kept, 1000)
    pushed(models, old, 3000)
    pushed(models, recent, 500, age_s=60)
    (models / f".staging-{old}").mkdir()            # a cut push of it, staged long ago
    (models / f".staging-{old}" / "x").write_bytes(b"s" * 200)
    then = time.time() - 2 * DAY
    os.utime(models / f".staging-{old}", (then, then))

    said = ask(work, [kept], dry=True)
    assert said == {"removed": [old], "bytes": 3000 + 200 + 2, "recent": [recent], "busy": []}, said  # + record
    assert (models / old).is_dir()                   # dry: nothing changed

    done = ask(work, [kept])
    assert done["removed"] == [old] and done["bytes"] == 3202, done
    left = sorted(os.listdir(models))
    assert left == sorted([kept, f".{kept}.verified.json", recent, f".{recent}.verified.json", f".{recent}.lock",
                           f".{old}.lock"]), left   # lock files stay: a push waiting on one may hold it open
    assert ask(work, [kept])["removed"] == []
    # a run about to be deleted (`deploy prune --dry-run`) does not keep what it loads
    assert ask(work, [kept], dry=True, going=["dep/runs/r0"])["removed"] == [kept]
    (work / "dep" / "runs" / "r0" / "profile.json").write_bytes(b"\xff\xfe not a record")
    with pytest.raises(FetchError, match="no pushed model directory removed"):   # unreadable: nothing goes
        ask(work, [])
    assert (models / kept).is_dir()


def test_a_content_being_pushed_is_left_and_a_shared_file_frees_nothing(work: Path) -> None:
    models = work / ".deployer" / "models"
    busy, twin, other = content(4), content(5), content(6)
    pushed(models, busy, 100)
    pushed(models, other, 100)
    folder = pushed(models, twin, 0)
    os.link(models / other / "sub" / "model.safetensors", folder / "shared.safetensors")  # a push linked it
    then = time.time() - 2 * DAY
    os.utime(folder, (then, then))
    lock = os.open(models / f".{busy}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)               # a push of it runs
        done = ask(work, [other])
    finally:
        os.close(lock)
    assert done["removed"] == [twin] and done["busy"] == [busy] and done["bytes"] == 2, done  # its record alone
    assert (models / other / "sub" / "model.safetensors").read_bytes() == b"w" * 100  # the shared bytes stay
    assert (models / busy).is_dir()


def test_nothing_is_followed_through_a_symlink(work: Path, tmp_path: Path) -> None:
    models = work / ".deployer" / "models"
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "data").write_bytes(b"keep me")
    old = pushed(models, content(7), 10)
    (old / "link").symlink_to(outside)               # a link inside a content that goes: unlinked, not followed
    (old / "file-link").symlink_to(outside / "data")
    then = time.time() - 2 * DAY
    os.utime(old, (then, then))
    assert ask(work, [])["removed"] == [content(7)]
    assert (outside / "data").read_bytes() == b"keep me"

    for name in os.listdir(models):
        os.unlink(models / name)
    models.rmdir()
    elsewhere = tmp_path / "elsewhere"
    pushed(elsewhere, content(8), 10)
    models.symlink_to(elsewhere)                     # the models dir itself a link: refused, nothing removed
    with pytest.raises(UnsafePath):
        ask(work, [])
    assert (elsewhere / content(8)).is_dir()


def test_no_models_dir_is_nothing_to_do(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    assert ask(tmp_path / "work", []) == {"removed": [], "bytes": 0, "recent": [], "busy": []}
