"""The single-host `up` against the scripted fake target (deployer/remote/fake.py): no sshd, no processes.

The pipeline runs unchanged over the real helper conversation; the real helper answers its requests on the fake
box's own files (a temporary home per box) and the fake supervisor "starts" engines whose log and fate each test
scripts. Reports and events are read in their JSON
form (what `--json` prints), which stays the same whatever types carry them.
"""

from __future__ import annotations

import json
import posixpath
from pathlib import Path
from typing import Any

import pytest

from deployer.errors import LaunchFailed, LockLost
from deployer.runner.up import UpOptions, up
from deployer.profile.model import Profile
from deployer.remote.fake import EngineScript, FakeRemote
from deployer.remote.program import payload_name

CASES = Path(__file__).resolve().parents[1] / "cases" / "sglang"
WORKDIR = "~/deploy"   # under the fake box's own home (each FakeRemote has one)
PORT = 30000
CRASH = "starting\nTraceback (most recent call last):\n  File \"x.py\", line 1\nRuntimeError: the fake engine broke\n"


@pytest.fixture(autouse=True)
def local_history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEPLOYER_HOME", str(tmp_path / "home"))


def deployment_dir(fake: FakeRemote, name: str = "demo") -> str:
    """Where WORKDIR's deployment `name` lives on the fake box."""
    return posixpath.join(fake.home, WORKDIR.removeprefix("~/"), name)


def read_json(path: str) -> Any:
    return json.loads(Path(path).read_bytes())


def profile(**args: Any) -> Profile:
    return Profile.model_validate({
        "name": "demo",
        "target": {"host": "gpu-box", "workdir": WORKDIR},
        "engine": {"kind": "sglang", "python": "/usr/bin/python3", "model_path": "/models/tiny", "port": PORT,
                   "args": args},
        "health": {"interval_s": 0.05, "startup_timeout_s": 20, "stall_timeout_s": 10},
        "retry": {"max_attempts": 3, "backoff_s": 0},
        "restart": {"grace_s": 1},
    })


OPTS = UpOptions(skip_preflight=True)


def run_up(fake: FakeRemote, prof: Profile, opts: UpOptions = OPTS) -> tuple[dict[str, Any], list[Any]]:
    events: list[Any] = []
    report = up(prof, opts, events.append, connection=fake)
    return report.to_json(), events


def kinds(events: list[Any]) -> list[str]:
    return [str(e.kind) for e in events]


def message(event: Any) -> str:
    data = event.data if hasattr(event, "data") else event.to_json()
    return str(data.get("message") or "")


def test_ready_on_the_first_attempt() -> None:
    fake = FakeRemote()
    report, events = run_up(fake, profile())
    assert report["status"] == "ready" and report["host"] == "fake"
    assert [a["outcome"] for a in report["attempts"]] == ["ready"]
    assert kinds(events)[0] == "attempt" and kinds(events)[-1] == "ready"
    assert {"attempt", "pushed", "ready"} <= set(kinds(events))
    root = deployment_dir(fake)
    run_id = report["attempts"][0]["run_id"]
    assert fake.current(root) == run_id and report["run_dir"] == posixpath.join(root, "runs", run_id)
    # what the target keeps: the run dir as push writes it (modes too), the outcome, the supervisor beside the lock
    run = Path(report["run_dir"])
    modes = {name: (run / name).stat().st_mode & 0o777 for name in ("launch.sh", "env", "profile.json",
                                                                  "supervise.json", "supervise.py",
                                                                  "supervise_guard.py")}
    assert modes == {"launch.sh": 0o700, "env": 0o600, "profile.json": 0o644, "supervise.json": 0o644,
                     "supervise.py": 0o644, "supervise_guard.py": 0o644}
    assert read_json(str(run / "outcome.json"))["outcome"] == "ready"
    assert read_json(str(run / "profile.json"))["content_hash"] == report["content_hash"]
    assert Path(root, "supervise_lease.py").is_file() and Path(root, payload_name()).is_file()
    # one helper, every request through it; no command the fake was not scripted for
    assert fake.spawned == 1 and not fake.unknown
    ops = [r["op"] for r in fake.requests]
    assert ops[:2] == ["run", "mkdirs"]   # the workdir's `~` spelt out (printf "$HOME"), then its dirs made
    assert "lease_take" in ops and ops[-1] == "lease_beat"
    assert fake.requests[-1]["release"] is True


def test_a_second_up_of_the_same_profile_finds_it_running() -> None:
    fake = FakeRemote()
    first, _ = run_up(fake, profile())
    again, events = run_up(fake, profile())
    assert again["status"] == "already-running" and again["content_hash"] == first["content_hash"]
    assert len(fake.started) == 1
    assert any("already running" in message(e) for e in events)


def test_a_crash_healed_by_a_change_on_attempt_two() -> None:
    oom = (CASES / "cuda-oom.log").read_text()

    def engine(n: int, record: dict[str, Any]) -> EngineScript:
        return EngineScript.crashing(oom, exit_code=137) if n == 1 else EngineScript.serving()

    fake = FakeRemote(engine)
    report, events = run_up(fake, profile())
    assert report["status"] == "ready"
    first, second = report["attempts"]
    assert (first["outcome"], second["outcome"]) == ("crashed", "ready")
    assert first["diagnosis"]["signature"] == "cuda-oom"
    assert set(first["change"]["args"]) == {"mem_fraction_static"}
    changed = first["change"]["args"]["mem_fraction_static"]
    assert 0 < changed < 0.907    # down from what the engine really used (its args dump), not from a default
    assert "mem_fraction_static" not in fake.started[0].record["profile"]["engine"]["args"]
    assert fake.started[1].record["profile"]["engine"]["args"]["mem_fraction_static"] == changed
    assert kinds(events).count("attempt") == 2 and "diagnosis" in kinds(events) and "change" in kinds(events)
    outcome = read_json(posixpath.join(fake.started[0].run_dir, "outcome.json"))
    assert outcome["outcome"] == "crashed" and outcome["change"]["args"] == first["change"]["args"]
    assert fake.current(deployment_dir(fake)) == second["run_id"] and not fake.unknown


def test_a_failed_replace_brings_the_previous_version_back() -> None:
    good: list[str] = []

    def engine(n: int, record: dict[str, Any]) -> EngineScript:
        if n == 1:
            good.append(record["content_hash"])
        return EngineScript.serving() if record["content_hash"] in good else EngineScript.crashing(CRASH)

    fake = FakeRemote(engine)
    serving, _ = run_up(fake, profile())
    with pytest.raises(LaunchFailed) as failed:
        run_up(fake, profile(context_length=4096), UpOptions(skip_preflight=True, heal=False))
    said = failed.value.message
    old = serving["attempts"][0]["run_id"]
    assert f"brought back the previous version {serving['content_hash'][:12]} ({old}): it is serving again" in said
    report = failed.value.outcome.to_json()
    assert report["replaced"] == old
    assert report["restored"]["run_id"] == old and report["restored"]["status"] == "ready"
    assert [s.run_dir.rsplit("/", 1)[1] for s in fake.started] == [old, report["attempts"][0]["run_id"], old]
    assert fake.current(deployment_dir(fake)) == old and fake.listening[PORT].endswith(old)
    assert not fake.unknown


def test_the_fake_says_what_it_was_not_scripted_for() -> None:
    from deployer.remote.conversation import Conversation

    conv = Conversation.open(FakeRemote())
    result = conv.run("systemctl restart something", check=False)
    assert result.exit_code == 127 and "no script" in result.stderr
    conv.close()


class _Lost:
    """A deployment lock whose lease is gone (DeploymentLock.ensure raising)."""

    def ensure(self) -> None:
        raise LockLost("lost the deployment lock")


def test_the_guard_covers_the_helpers_requests_too() -> None:
    from deployer.box.lock import Guarded
    from deployer.remote.conversation import Conversation

    fake = FakeRemote()
    conv = Conversation.open(fake)
    guarded = Guarded(conv, _Lost())  # type: ignore[arg-type]
    assert guarded.helper is not None
    with pytest.raises(LockLost):
        guarded.helper.snapshot(["/srv/deploy"], 5.0)
    with pytest.raises(LockLost):
        guarded.helper.supervise(["status", "/srv/deploy/demo/runs/x"], 5.0)
    with pytest.raises(LockLost):
        guarded.put_all([(b"x", "/srv/deploy/f", 0o644)])
    assert fake.requests == []   # nothing reached the target
    conv.close()
