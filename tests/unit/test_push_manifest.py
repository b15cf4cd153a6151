"""`engine.weights.push` (issue 25): the directory read on the controller (regular files only, `.git`/`.cache` left
out, sha256 kept in a cache), the profile rules, and the target-side receiver (push.py, run for real as
the program deployer ships, on this machine through the local transport) in pieces smaller than its files."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

import deployer.box.pushweights as pushweights
from deployer.errors import ProfileError, TransferFailed
from deployer.events import Event, Progressed, Warn
from deployer.prepare.pushed import HashCache, pinned_push, plan_push
from deployer.profile.loader import load_profile
from deployer.remote.local import LocalRemote
from deployer.box.pushweights import needed_push, push


def profile(tmp_path: Path, engine: str) -> Any:
    path = tmp_path / "p.yaml"
    path.write_text(f"name: w\ntarget: {{host: local, workdir: {tmp_path / 'work'}}}\nengine:\n{engine}")
    return load_profile(path)


def model(tmp_path: Path, weights: int = 250_000) -> Path:
    folder = tmp_path / "models" / "ft"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(os.urandom(weights))
    (folder / "sub" / "b.txt").write_text("b")
    (folder / ".git").mkdir()
    (folder / ".git" / "HEAD").write_text("ref")
    (folder / ".cache").mkdir()
    (folder / ".cache" / "x.lock").write_text("")
    return folder


PUSHED = "  model_path: models/ft\n  weights: {push: true}\n"


def test_the_directory_is_read_relative_to_the_profile_without_git_or_cache(tmp_path: Path) -> None:
    model(tmp_path)
    plan = plan_push(profile(tmp_path, PUSHED), None)
    assert plan is not None and [f.name for f in plan.files] == ["config.json", "model.safetensors", "sub/b.txt"]
    assert plan.files[2].sha256 == hashlib.sha256(b"b").hexdigest() and plan.source == tmp_path / "models" / "ft"
    again = plan_push(profile(tmp_path, PUSHED), None)
    assert again is not None and again.content == plan.content
    (tmp_path / "models" / "ft" / "sub" / "b.txt").write_text("c")
    changed = plan_push(profile(tmp_path, PUSHED), None)
    assert changed is not None and changed.content != plan.content


@pytest.mark.parametrize("odd", ["link", "dirlink", "fifo"])
def test_a_symlink_or_special_file_is_refused_in_one_line(tmp_path: Path, odd: str) -> None:
    folder = model(tmp_path)
    if odd == "link":
        (folder / "sub" / "w.json").symlink_to(folder / "config.json")
    elif odd == "dirlink":
        (folder / "more").symlink_to(folder / "sub")
    else:
        os.mkfifo(folder / "sub" / "pipe")
    with pytest.raises(ProfileError, match="symbolic link|not a regular file"):
        plan_push(profile(tmp_path, PUSHED), None)


def test_a_large_first_hashing_is_said_and_a_cached_one_is_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import deployer.prepare.pushed as pushed

    monkeypatch.setattr(pushed, "SAY_HASHING", 100_000)
    model(tmp_path)
    said: list[str] = []
    plan_push(profile(tmp_path, PUSHED), tmp_path / "cache", said.append)
    assert len(said) == 1 and said[0].startswith("hashing 250.0 kB under "), said
    plan_push(profile(tmp_path, PUSHED), tmp_path / "cache", said.append)
    assert len(said) == 1


def test_the_hash_cache_is_used_while_size_mtime_and_inode_are_the_same(tmp_path: Path) -> None:
    f = tmp_path / "a.bin"
    f.write_bytes(b"one")
    cache = HashCache(tmp_path / "cache")
    first = cache.sha256(f, f.stat())
    cache.save()
    kept = HashCache(tmp_path / "cache")
    key = str(f.resolve())
    kept.known[key][3] = "0" * 64  # what the cache says is believed while the file's stamp matches
    assert kept.sha256(f, f.stat()) == "0" * 64
    f.write_bytes(b"two")
    assert kept.sha256(f, f.stat()) == hashlib.sha256(b"two").hexdigest() != first


def test_the_profile_rules_of_push(tmp_path: Path) -> None:
    p = profile(tmp_path, PUSHED)
    assert p.engine.args["served_model_name"] == "ft" and p.engine.served_model == "ft"
    named = profile(tmp_path, PUSHED + "  args: {served_model_name: mine}\n")
    assert named.engine.args["served_model_name"] == "mine"
    for bad, says in (("  model_path: m\n  weights: {push: true, revision: v1}\n", "weights.revision is for a hub"),
                      ("  model_path: m\n  weights: {push: true}\n  args: {revision: v1}\n", "loads a directory"),
                      ("  model_path: a/b\n  weights: {pushed: " + "a" * 64 + "}\n", "needs weights.push")):
        with pytest.raises(ProfileError, match=says):
            profile(tmp_path, bad)
    with pytest.raises(ProfileError, match="is not a directory here"):
        plan_push(profile(tmp_path, "  model_path: nowhere\n  weights: {push: true}\n"), None)
    pinned = pinned_push(p, "/w/.deployer/models/" + "b" * 64, "b" * 64)
    assert pinned.engine.weights is not None and pinned.engine.weights.pushed == "b" * 64
    assert pinned.engine.model_path.endswith("b" * 64)
    assert pinned.engine.env["HF_HUB_OFFLINE"] == "1" and pinned.engine.served_model == "ft"
    assert plan_push(pinned, None) is None  # a run's record: nothing to push again


def test_the_receiver_takes_files_in_pieces_and_a_second_push_sends_nothing(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pushweights, "BATCH", 64_000)   # the weights file travels in four pieces
    folder = model(tmp_path)
    plan = plan_push(profile(tmp_path, PUSHED), None)
    assert plan is not None
    work = str(tmp_path / "work")
    (tmp_path / "work").mkdir(mode=0o700)
    assert needed_push(LocalRemote(), plan, work).missing == plan.total
    assert os.listdir(work) == []  # `deploy plan` wrote nothing
    seen: list[Event] = []
    got = push(LocalRemote(), plan, work, seen.append)
    there = Path(got.folder)
    assert got.sent == plan.total and there == tmp_path / "work" / ".deployer" / "models" / plan.content
    assert (there / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()
    assert (there / "sub" / "b.txt").read_text() == "b" and not (there / ".git").exists()
    assert push(LocalRemote(), plan, work, seen.append).sent == 0
    assert needed_push(LocalRemote(), plan, work).missing == 0
    assert [e for e in seen if isinstance(e, Progressed)] or got.seconds < 1.0


def test_a_staged_piece_that_keeps_failing_is_refused_in_one_line(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A file that changes under the push (its bytes are not what was hashed): the staged copy never checks out;
    sent twice, then one line."""
    folder = model(tmp_path)
    plan = plan_push(profile(tmp_path, PUSHED), None)
    assert plan is not None
    (folder / "model.safetensors").write_bytes(os.urandom(250_000))  # same size, other bytes
    (tmp_path / "work").mkdir(mode=0o700)
    seen: list[Event] = []
    with pytest.raises(TransferFailed, match=r"model.safetensors: .* staged, .* sent; removed \(twice\)"):
        push(LocalRemote(), plan, str(tmp_path / "work"), seen.append)
    assert [e for e in seen if isinstance(e, Warn) and "sending it again" in e.message]
    assert not (tmp_path / "work" / ".deployer" / "models" / plan.content).exists()
