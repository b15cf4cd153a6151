"""Weights as a step of their own (issue 25, item 3), end to end over the real sshd: `deploy up` of a profile with
`engine.weights` fetches the hub repo on the target from the local stand-in of the hub's file API
(tests/standin/hubstub.py) before anything is stopped, and the stand-in engine loads that commit offline."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from standin.hubstub import HubStub, tiny_repo

from deploy_helpers import deploy, events, write_profile
from sshbed import free_port, small_disk_sshd

pytestmark = pytest.mark.integration

REPO_ID = "acme/tiny"
TOKEN = "hf_weights_secret_4711"


def weights_profile(tmp_path: Path, sshd: Any, hub: HubStub, *, name: str, hf_home: Path,
                    port: int | None = None) -> Path:
    return write_profile(tmp_path, sshd, name=name, model=REPO_ID, port=port,
                         env={"HF_HOME": str(hf_home), "HF_TOKEN": "${WEIGHTS_TOKEN}"},
                         extra={"engine": {"weights": {"endpoint": hub.endpoint}}})


def up(prof: Path, home: Path, *more: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return deploy("up", str(prof), "--skip-preflight", *more, home=home, timeout=timeout,
                  env={"WEIGHTS_TOKEN": TOKEN})


def run_dir_of(result: subprocess.CompletedProcess[str]) -> Path:
    return Path(json.loads(result.stdout.splitlines()[-1])["run_dir"])


def test_up_fetches_the_repo_on_the_target_and_the_engine_loads_that_commit_offline(tmp_path: Path,
                                                                                     sshd: Any) -> None:
    repo = tiny_repo(REPO_ID, 3_000_000)
    with HubStub(repo) as hub:
        hub.token = TOKEN
        hf_home = tmp_path / "hf"
        prof = weights_profile(tmp_path, sshd, hub, name="wfetch", hf_home=hf_home)
        home = tmp_path / "home"
        made = up(prof, home, "--json")
        try:
            assert made.returncode == 0, made.stderr[-3000:]
            run_dir = run_dir_of(made)
            snapshot = hf_home / "hub" / "models--acme--tiny" / "snapshots" / repo.commit
            log = (run_dir / "engine.log").read_text() if (run_dir / "engine.log").exists() else \
                "".join(p.read_text() for p in run_dir.glob("*.log"))
            assert f"standin: weights from {snapshot}" in log
            record = json.loads((run_dir / "profile.json").read_text())
            engine = record["profile"]["engine"] if "profile" in record else record["engine"]
            assert engine["weights"]["revision"] == repo.commit and engine["args"]["revision"] == repo.commit
            assert engine["env"]["HF_HUB_OFFLINE"] == "1"
            fetched = [e for e in events(made.stdout) if e.get("source") == "fetch"]
            assert fetched and fetched[-1]["bytes"] == repo.total and fetched[-1]["total_bytes"] == repo.total
            assert set(hub.auth_seen) == {f"Bearer {TOKEN}"}
            assert TOKEN not in made.stdout + made.stderr
            assert TOKEN not in (run_dir / "launch.sh").read_text()

            again = up(prof, home)  # the same commit: nothing fetched, nothing restarted
            assert again.returncode == 0, again.stderr[-2000:]
            said = again.stdout + again.stderr
            assert "already running" in said and "already on disk" in said, said
            assert sum(hub.served.values()) == repo.total
        finally:
            deploy("down", str(prof), home=home)


def test_an_interrupted_fetch_fails_in_one_line_and_the_next_up_fetches_only_the_rest(tmp_path: Path,
                                                                                       sshd: Any) -> None:
    repo = tiny_repo(REPO_ID, 2_000_000)
    weights = next(f for f in repo.files if f.name == "model.safetensors")
    with HubStub(repo) as hub:
        hub.cut_after, hub.cuts = 500_000, 99
        prof = weights_profile(tmp_path, sshd, hub, name="wcut", hf_home=tmp_path / "hf")
        home = tmp_path / "home"
        failed = up(prof, home)
        assert failed.returncode == 4, failed.stdout[-2000:] + failed.stderr[-2000:]
        lines = [ln for ln in failed.stderr.strip().splitlines() if ln.strip()]
        assert any("broke off" in ln and "model.safetensors" in ln for ln in lines), failed.stderr
        assert "Traceback" not in failed.stderr
        sent_before = hub.served["model.safetensors"]
        assert sent_before == 1_500_000  # three tries of 500 kB each, kept on the target
        hub.cuts = 0
        made = up(prof, home)
        try:
            assert made.returncode == 0, made.stderr[-3000:]
            assert hub.served["model.safetensors"] == len(weights.data)  # the second up sent only the rest
            assert ("model.safetensors", 1_500_000) in hub.starts
        finally:
            deploy("down", str(prof), home=home)


def test_a_file_larger_than_listed_is_refused_in_one_line_and_nothing_starts(tmp_path: Path, sshd: Any) -> None:
    repo = tiny_repo(REPO_ID, 400_000)
    with HubStub(repo) as hub:
        hub.lie = {"model.safetensors": 100_000}
        prof = weights_profile(tmp_path, sshd, hub, name="wlie", hf_home=tmp_path / "hf")
        home = tmp_path / "home"
        failed = up(prof, home)
        assert failed.returncode == 3, failed.stdout[-2000:] + failed.stderr[-2000:]
        assert "model.safetensors: the hub listed 100000 bytes but sent more; refused" in failed.stderr
        assert "Traceback" not in failed.stderr
        assert not (tmp_path / "work" / "wlie" / "current").exists()  # nothing was started


def test_a_file_whose_sha256_is_not_the_listed_one_is_refused_in_one_line_and_nothing_is_published(
        tmp_path: Path, sshd: Any) -> None:
    """The stand-in hub sends model.safetensors with one byte changed (its listing keeps the real size and sha256):
    the fetch fails in one line (exit 3: a transfer whose hash did not match, deployer/errors.py), the bad bytes
    are removed, no snapshot names them, nothing starts; once the hub sends the right bytes the next `up` serves."""
    repo = tiny_repo(REPO_ID, 400_000)
    weights = next(f for f in repo.files if f.name == "model.safetensors")
    with HubStub(repo) as hub:
        hub.corrupt = {"model.safetensors"}
        hf_home = tmp_path / "hf"
        prof = weights_profile(tmp_path, sshd, hub, name="wsha", hf_home=hf_home)
        home = tmp_path / "home"
        try:
            failed = up(prof, home)
            assert failed.returncode == 3, failed.stdout[-2000:] + failed.stderr[-2000:]
            errors = [ln for ln in failed.stderr.splitlines() if ln.startswith("error: ")]
            assert len(errors) == 1 and "model.safetensors: its sha256 is not the one the hub listed; refused" \
                in errors[0], failed.stderr
            assert "Traceback" not in failed.stderr
            assert hub.served["model.safetensors"] >= len(weights.data)  # it came whole: refused by its hash
            folder = hf_home / "hub" / "models--acme--tiny"
            assert not [p for p in (folder / "blobs").iterdir() if p.name.startswith(weights.sha256)]
            assert not (folder / "snapshots" / repo.commit / "model.safetensors").exists()
            assert not (folder / "refs" / "main").exists()
            assert not (tmp_path / "work" / "wsha" / "current").exists()  # nothing was started
            hub.corrupt = set()
            made = up(prof, home)
            assert made.returncode == 0, made.stderr[-3000:]
            assert (folder / "snapshots" / repo.commit / "model.safetensors").read_bytes() == weights.data
        finally:
            deploy("down", str(prof), home=home)


@pytest.fixture()
def small_hf(tmp_path: Path) -> Iterator[tuple[Any, Path]]:
    """An 8 MB tmpfs for HF_HOME, mounted before its own sshd starts (the sshd's mount namespace copies it)."""
    with small_disk_sshd(tmp_path) as bed_disk:
        yield bed_disk


def test_a_repo_larger_than_the_free_disk_is_refused_before_a_byte_is_fetched(tmp_path: Path,
                                                                              small_hf: Any) -> None:
    bed, disk = small_hf
    repo = tiny_repo(REPO_ID, 12_000_000)
    with HubStub(repo) as hub:
        prof = weights_profile(tmp_path, bed, hub, name="wdisk", hf_home=disk / "hf")
        failed = up(prof, tmp_path / "home")
        assert failed.returncode == 4, failed.stdout[-2000:] + failed.stderr[-2000:]
        assert "needs 12.0 MB more on" in failed.stderr and "free" in failed.stderr, failed.stderr
        assert "Traceback" not in failed.stderr
        assert hub.served == {}


def test_a_disk_that_fills_during_the_fetch_is_said_as_such(tmp_path: Path, small_hf: Any) -> None:
    bed, disk = small_hf
    repo = tiny_repo(REPO_ID, 5_000_000)
    with HubStub(repo) as hub:
        hub.rate = 2_000_000
        prof = weights_profile(tmp_path, bed, hub, name="wfill", hf_home=disk / "hf")
        filled = threading.Event()

        def fill_when_it_flows() -> None:
            deadline = time.monotonic() + 30
            while hub.served.get("model.safetensors", 0) < 500_000 and time.monotonic() < deadline:
                time.sleep(0.02)
            with open(disk / "filler", "wb", buffering=0) as f:
                try:
                    for _ in range(2000):  # 8 MB at most
                        f.write(b"\0" * 16384)
                except OSError as e:
                    assert e.errno == errno.ENOSPC
            filled.set()

        filler = threading.Thread(target=fill_when_it_flows, daemon=True)
        filler.start()
        failed = up(prof, tmp_path / "home")
        filler.join(timeout=30)
        assert filled.is_set()
        assert failed.returncode == 4, failed.stdout[-2000:] + failed.stderr[-2000:]
        assert "the disk filled while writing" in failed.stderr, failed.stderr
        assert "Traceback" not in failed.stderr


def poll(port: int, stop: threading.Event, seen: list[tuple[float, bool]]) -> None:
    """GET /health every 50 ms until `stop` (bounded: 10 minutes), noting (when, answered 200)."""
    deadline = time.monotonic() + 600
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                ok = resp.status == 200
        except OSError:
            ok = False
        seen.append((time.time(), ok))
        time.sleep(0.05)


def test_an_upgrade_keeps_the_old_version_serving_until_the_new_weights_are_on_disk(tmp_path: Path,
                                                                                     sshd: Any) -> None:
    v1 = tiny_repo(REPO_ID, 500_000, seed="v1")
    with HubStub(v1) as hub:
        port = free_port()
        prof = weights_profile(tmp_path, sshd, hub, name="wupg", hf_home=tmp_path / "hf", port=port)
        home = tmp_path / "home"
        first = up(prof, home, "--json")
        assert first.returncode == 0, first.stderr[-3000:]
        try:
            v2 = tiny_repo(REPO_ID, 4_000_000, seed="v2")
            hub.publish(v2)
            hub.rate = 1_000_000  # ~4 s of download
            stop, seen = threading.Event(), []
            poller = threading.Thread(target=poll, args=(port, stop, seen), daemon=True)
            poller.start()
            upgraded = up(prof, home, "--json", timeout=180)
            stop.set()
            poller.join(timeout=10)
            assert upgraded.returncode == 0, upgraded.stderr[-3000:]
            assert hub.last_byte_at is not None
            during = [ok for at, ok in seen if at < hub.last_byte_at]
            assert len(during) > 20, len(during)       # the poll ran through the download
            assert all(during), "the old version stopped answering before the new weights were on disk"
            record = json.loads((run_dir_of(upgraded) / "profile.json").read_text())
            engine = record["profile"]["engine"] if "profile" in record else record["engine"]
            assert engine["weights"]["revision"] == v2.commit
            stopping = [e["at"] for e in events(upgraded.stdout)
                        if e.get("event") == "info" and "stopping the running version" in e.get("message", "")]
            assert stopping and stopping[0] >= hub.last_byte_at
        finally:
            deploy("down", str(prof), home=home)


def engine_log_text(run_dir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in run_dir.glob("*.log"))


def test_a_rollback_loads_the_weights_it_ran_with_even_with_the_hub_gone(tmp_path: Path, sshd: Any) -> None:
    from test_oncall import oncall

    v1 = tiny_repo(REPO_ID, 300_000, seed="rb1")
    home = tmp_path / "home"
    with HubStub(v1) as hub:
        prof = weights_profile(tmp_path, sshd, hub, name="wrb", hf_home=tmp_path / "hf")
        first = up(prof, home, "--json")
        assert first.returncode == 0, first.stderr[-3000:]
        v2 = tiny_repo(REPO_ID, 300_000, seed="rb2")
        hub.publish(v2)
        second = up(prof, home, "--json")
        assert second.returncode == 0, second.stderr[-3000:]
        assert f"snapshots/{v2.commit}" in engine_log_text(run_dir_of(second))
    try:  # the hub is gone now: main cannot be resolved, but the commit v1 ran with is on disk
        back = oncall(sshd, tmp_path, "rollback", "wrb", "--json")
        assert back.returncode == 0, back.stdout[-2000:] + back.stderr[-2000:]
        log = engine_log_text(run_dir_of(back))
        assert f"standin: weights from {tmp_path / 'hf' / 'hub' / 'models--acme--tiny' / 'snapshots' / v1.commit}" \
            in log
    finally:
        deploy("down", str(prof), home=home)


def document(stdout: str) -> Any:
    """The one JSON document a `--json` command printed (before the error envelope line of a failure)."""
    return json.JSONDecoder().raw_decode(stdout.lstrip())[0]


def test_plan_says_what_the_fetch_takes_and_prepare_fetches_without_launching(tmp_path: Path, small_hf: Any) -> None:
    """`deploy plan` lists the commit, size and missing bytes against the free disk (nothing fetched; a repo
    larger than the disk is a problem); `deploy prepare` fetches it and launches nothing; plan then has nothing
    left to fetch."""
    bed, disk = small_hf
    env = {"WEIGHTS_TOKEN": TOKEN}
    big, small = tiny_repo(REPO_ID, 12_000_000), tiny_repo(REPO_ID, 3_000_000)
    with HubStub(big) as hub:
        prof = weights_profile(tmp_path, bed, hub, name="wplanbig", hf_home=disk / "hf")
        planned = deploy("plan", str(prof), "--json", home=tmp_path / "home", env=env)
        assert planned.returncode == 4 and "Traceback" not in planned.stderr, planned.stderr[-2000:]
        weights = document(planned.stdout)["weights"]
        assert weights["commit"] == big.commit and weights["missing_bytes"] == big.total and not weights["fits"]
        assert "weights:" in planned.stderr + planned.stdout and hub.served == {}
    with HubStub(small) as hub:
        prof = weights_profile(tmp_path, bed, hub, name="wplan", hf_home=disk / "hf")
        home = tmp_path / "home2"
        text = deploy("plan", str(prof), home=home, env=env)
        assert f"weights {small.commit[:12]} on" in text.stdout and "(fits)" in text.stdout, text.stdout
        first = document(deploy("plan", str(prof), "--json", home=home, env=env).stdout)
        assert first["resolution"] == "after the fetch", first["resolution"]   # the engine would download it
        assert any("dry resolution skipped: acme/tiny@main is fetched after preflight" in w
                   for w in first["warnings"]), first["warnings"]
        assert hub.served == {}
        prepared = deploy("prepare", str(prof), "--json", home=home, env=env, timeout=120)
        assert prepared.returncode == 0, prepared.stderr[-2000:]
        row = json.loads(prepared.stdout.splitlines()[-1])["environments"][0]
        assert row["weights"]["commit"] == small.commit and row["weights"]["fetched_bytes"] == small.total
        assert sum(hub.served.values()) == small.total
        assert not (tmp_path / "work" / "wplan" / "current").exists()  # nothing launched
        replanned = document(deploy("plan", str(prof), "--json", home=home, env=env).stdout)
        after = replanned["weights"]
        assert after["missing_bytes"] == 0 and after["fits"]
        assert replanned["resolution"] == "done", replanned["resolution"]   # offline, against the commit fetched
        assert "itself as it starts" not in text.stdout, text.stdout
        # without engine.weights the engine downloads the repo as it starts: plan says so, and what moves it first
        data = yaml.safe_load(prof.read_text())
        del data["engine"]["weights"]
        itself = tmp_path / "itself.yaml"
        itself.write_text(yaml.safe_dump(data, sort_keys=False))
        plain = deploy("plan", str(itself), home=home, env=env)
        assert f"weights: the engine downloads {REPO_ID} itself as it starts" in plain.stdout, plain.stdout
        assert "`engine.weights: {}` fetches it first" in plain.stdout
