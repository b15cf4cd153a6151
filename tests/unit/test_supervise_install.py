"""install.env_build (the helper's op): the lock, the build, the record, the publish by symlink, reuse,
a failed step, dead builds, and refusals; with small real commands as the steps (no venv: that is the
integration test's, tests/integration/test_install_env.py)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from deployer.supervisor.base import UnsafePath
from deployer.supervisor.install import BuildRefused, env_build

DIGEST = "0123456789abcdef"
FREEZE = '[{"name": "Tiny_Pkg", "version": "1.0"}, {"name": "other", "version": "2"}]'


def request(work: Path, build_id: str = "b1", steps: list[list[str]] | None = None, **more: Any) -> dict[str, Any]:
    root = work / ".deployer" / "envs"
    build = root / f"{DIGEST}.build-{build_id}"
    return {"root": str(root), "owned_from": str(work), "digest": DIGEST, "build_id": build_id,
            "steps": [{"name": f"s{i}", "argv": argv, "env": {}} for i, argv in enumerate(
                steps if steps is not None else [["mkdir", str(build)], ["sh", "-c", f"echo '{FREEZE}'"]])],
            "record": {"digest": DIGEST, "spec": {"packages": ["tiny-pkg==1.0"]}, "tool": "pip 23",
                       "python_version": "3.11.2",
                       "resolved_hint": [{"name": "tiny-pkg", "version": "1.0", "url": "file:///w/t.whl",
                                          "size": 123}]},
            "timeout": 60, **more}


def test_builds_publishes_by_a_link_and_reuses(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir(mode=0o700)
    first = env_build(request(work), dict(os.environ))
    root = work / ".deployer" / "envs"
    assert first["failed"] is None and first["reused"] is False
    assert os.readlink(root / DIGEST) == f"{DIGEST}.build-b1"   # relative: the build keeps its own name
    record = json.loads((root / DIGEST / "deployer-env.json").read_text())
    assert record["digest"] == DIGEST and "resolved_hint" not in record and record["built_at"].endswith("Z")
    assert record["resolved"] == [{"name": "other", "version": "2", "url": None, "size": None},
                                  {"name": "Tiny_Pkg", "version": "1.0", "url": "file:///w/t.whl", "size": 123}]
    assert (root / f"{DIGEST}.build-b1" / "deployer-env.json").stat().st_mode & 0o777 == 0o600
    # the same digest again: reused, its steps never run (this one would fail)
    again = env_build(request(work, "b2", steps=[["false"]]), dict(os.environ))
    assert again["reused"] is True and again["record"] == first["record"]
    assert sorted(p.name for p in root.iterdir()) == [DIGEST, f"{DIGEST}.build-b1", f"{DIGEST}.lock"]


def test_a_failed_step_publishes_nothing_and_leaves_no_build(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir(mode=0o700)
    build = work / ".deployer" / "envs" / f"{DIGEST}.build-b1"
    reply = env_build(request(work, steps=[["mkdir", str(build)], ["sh", "-c", "echo ERROR: no such version >&2; exit 1"]]),
                      dict(os.environ))
    assert reply["failed"] == "s1" and reply["exit_code"] == 1 and "ERROR: no such version" in reply["output"]
    assert not build.exists() and not (work / ".deployer" / "envs" / DIGEST).exists()


def test_dead_builds_are_cleared_and_a_concurrent_build_happens_once(tmp_path: Path) -> None:
    work = tmp_path / "work"
    root = work / ".deployer" / "envs"
    root.mkdir(parents=True, mode=0o700)
    (root / f"{DIGEST}.build-dead").mkdir()       # a build whose deploy died
    (root / f"{DIGEST}.link-dead").symlink_to("/")  # a link temp left behind: removed, never followed
    runs = tmp_path / "runs"
    replies: list[dict[str, Any]] = []

    def build(build_id: str) -> None:
        steps = [["sh", "-c", f"echo x >> {runs}; sleep 0.3; mkdir {root}/{DIGEST}.build-{build_id}"],
                 ["sh", "-c", f"echo '{FREEZE}'"]]
        replies.append(env_build(request(work, build_id, steps=steps), dict(os.environ)))

    threads = [threading.Thread(target=build, args=(f"t{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert runs.read_text().count("x") == 1          # built once, under the lock
    assert sorted(r["reused"] for r in replies) == [False, True]
    names = sorted(p.name for p in root.iterdir())
    assert f"{DIGEST}.build-dead" not in names and f"{DIGEST}.link-dead" not in names
    assert Path("/").exists()


def test_refusals(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir(mode=0o700)
    (tmp_path / "elsewhere").mkdir()
    (work / ".deployer").symlink_to(tmp_path / "elsewhere")   # never built through a symlink
    with pytest.raises(BuildRefused, match="symbolic link"):
        env_build(request(work), dict(os.environ))
    assert list((tmp_path / "elsewhere").iterdir()) == []
    with pytest.raises(BuildRefused):
        env_build({**request(work), "digest": "../../etc"}, dict(os.environ))
    (work / ".deployer").unlink()
    (work / ".deployer").mkdir(mode=0o777)
    (work / ".deployer").chmod(0o777)   # another user could write it: refused
    with pytest.raises(UnsafePath):
        env_build(request(work), dict(os.environ))


def test_prune_keeps_what_runs_use_what_was_used_lately_and_what_is_being_built(tmp_path: Path) -> None:
    import fcntl

    from deployer.supervisor.install import env_prune

    work = tmp_path / "work"
    root = work / ".deployer" / "envs"
    root.mkdir(parents=True, mode=0o700)
    digests = {k: k * 16 for k in "abcde"}
    for digest in digests.values():
        (root / f"{digest}.build-1").mkdir()
        (root / digest).symlink_to(f"{digest}.build-1")
        os.utime(root / digest, (1, 1), follow_symlinks=False)   # unused since 1970
    (root / f"{digests['d']}").unlink()                           # d: a dead build, never published
    os.utime(root / digests["b"], None, follow_symlinks=False)    # b: reused just now
    held = os.open(root / f"{digests['e']}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)                              # e: a build in progress
    (root / "notes.txt").write_text("not deployer's")
    try:
        reply = env_prune({"root": str(root), "owned_from": str(work), "keep": [digests["a"]], "min_age_s": 600})
    finally:
        os.close(held)
    assert sorted(reply["removed"]) == sorted([digests["c"], f"{digests['c']}.build-1", f"{digests['d']}.build-1"])
    left = sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock"))
    assert left == sorted([digests["a"], f"{digests['a']}.build-1", digests["b"], f"{digests['b']}.build-1",
                           digests["e"], f"{digests['e']}.build-1", "notes.txt"])


def test_a_reuse_marks_the_environment_used(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir(mode=0o700)
    env_build(request(work), dict(os.environ))
    link = work / ".deployer" / "envs" / DIGEST
    os.utime(link, (1, 1), follow_symlinks=False)
    reply = env_build({**request(work, "b2", steps=[]), "reuse_only": True}, dict(os.environ))
    assert reply["reused"] is True and link.lstat().st_mtime > 1
    missing = env_build({**request(tmp_path / "nowhere", "b3", steps=[]), "reuse_only": True}, dict(os.environ))
    assert missing["record"] is None and not (tmp_path / "nowhere").exists()   # nothing created


def test_the_steps_of_a_build_end_with_the_conversation(tmp_path: Path) -> None:
    """The helper calls stop_running when its conversation ends: a step still running (pip) is killed, so it
    never writes into a build whose lock is gone."""
    import time

    from deployer.supervisor import install

    work = tmp_path / "work"
    work.mkdir(mode=0o700)
    replies: list[dict[str, Any]] = []
    thread = threading.Thread(target=lambda: replies.append(
        env_build(request(work, steps=[["sleep", "60"]]), dict(os.environ))))
    thread.start()
    deadline = time.monotonic() + 10
    while not install.RUNNING and time.monotonic() < deadline:
        time.sleep(0.05)
    assert install.RUNNING
    install.stop_running()
    thread.join(10)
    assert replies and replies[0]["failed"] == "s0" and replies[0]["exit_code"] == -9
    assert not install.RUNNING and not (work / ".deployer" / "envs" / DIGEST).exists()
