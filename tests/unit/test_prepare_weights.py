"""Weights as a step of their own (issue 25, item 3): the target-side fetch (fetch.py, run for real as the
program deployer ships, on this machine) against the local stand-in of the hub's file API (tests/standin/hubstub.py),
and the profile pinned to the commit it fetched."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from standin.hubstub import HubStub, tiny_repo

from deployer.errors import ProfileError, TargetError, TransferFailed
from deployer.events import Event, Progressed
from deployer.prepare.weights import WeightsPlan, pinned, plan_for
from deployer.profile.loader import load_profile
from deployer.remote.local import LocalRemote
from deployer.box.weights import fetch

REPO = "acme/tiny"


def plan(hub: HubStub, cache: Path, revision: str = "main", token: str | None = None) -> WeightsPlan:
    return WeightsPlan(REPO, revision, str(cache), hub.endpoint, token)


def run(hub: HubStub, cache: Path, **kw: Any) -> tuple[Any, list[Event]]:
    seen: list[Event] = []
    return fetch(LocalRemote(), plan(hub, cache, **kw), seen.append, progress_s=0.05), seen


def test_a_fetch_lays_out_the_cache_the_engines_read_and_a_second_fetches_nothing(tmp_path: Path) -> None:
    repo = tiny_repo(REPO, 1_000_000)
    with HubStub(repo) as hub:
        hub.rate = 4_000_000
        got, seen = run(hub, tmp_path / "hub")
        assert got.commit == repo.commit and got.fetched == repo.total == got.total and got.files == 3
        folder = tmp_path / "hub" / "models--acme--tiny"
        assert (folder / "refs" / "main").read_text() == repo.commit
        for f in repo.files:
            link = folder / "snapshots" / repo.commit / f.name
            assert link.is_symlink() and not os.readlink(link).startswith("/")
            assert link.read_bytes() == f.data
            blob = f.sha256 if f.lfs else f.blob_id
            assert os.readlink(link) == f"../../blobs/{blob}"
        assert not list(folder.glob("blobs/*.incomplete"))
        downloads = [e.download for e in seen if isinstance(e, Progressed) and e.download is not None]
        assert downloads and downloads[-1].bytes == repo.total and downloads[-1].total_bytes == repo.total
        assert any((d.rate_bytes_s or 0) > 0 for d in downloads)

        again, _ = run(hub, tmp_path / "hub")
        assert again.commit == repo.commit and again.fetched == 0
        assert sum(hub.served.values()) == repo.total  # nothing sent twice


def test_a_dropped_connection_resumes_from_what_arrived(tmp_path: Path) -> None:
    repo = tiny_repo(REPO, 1_500_000)
    with HubStub(repo) as hub:
        hub.cut_after, hub.cuts = 600_000, 1
        got, _ = run(hub, tmp_path / "hub")
        weights = next(f for f in repo.files if f.name == "model.safetensors")
        assert got.commit == repo.commit
        assert hub.served["model.safetensors"] == len(weights.data)  # the rest only, after the cut
        assert ("model.safetensors", 600_000) in hub.starts


def test_a_transfer_that_keeps_breaking_leaves_its_part_for_the_next_try(tmp_path: Path) -> None:
    repo = tiny_repo(REPO, 1_500_000)
    with HubStub(repo) as hub:
        hub.cut_after, hub.cuts = 200_000, 99
        with pytest.raises(TargetError, match="broke off"):
            run(hub, tmp_path / "hub")
        part = next((tmp_path / "hub" / "models--acme--tiny" / "blobs").glob("*.incomplete"))
        assert part.stat().st_size == 600_000  # three tries, 200 kB each
        hub.cuts = 0
        got, _ = run(hub, tmp_path / "hub")
        assert got.commit == repo.commit and got.fetched == 1_500_000 - 600_000  # the small files came before
        weights = next(f for f in repo.files if f.name == "model.safetensors")
        assert hub.served["model.safetensors"] == len(weights.data)  # every byte sent once


def test_a_size_that_does_not_match_the_listing_is_refused_in_one_line(tmp_path: Path) -> None:
    repo = tiny_repo(REPO, 300_000)
    with HubStub(repo) as hub:
        hub.lie = {"model.safetensors": 200_000}
        with pytest.raises(TransferFailed) as caught:
            run(hub, tmp_path / "hub")
        assert "model.safetensors: the hub listed 200000 bytes but sent more" in str(caught.value)
        assert "\n" not in str(caught.value)
        snapshot = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / repo.commit
        assert not (snapshot / "model.safetensors").exists()


def test_a_disk_too_small_for_what_is_missing_is_refused_before_any_byte(tmp_path: Path) -> None:
    repo = tiny_repo(REPO, 1_000)
    with HubStub(repo) as hub:
        hub.lie = {"model.safetensors": 1 << 60}
        with pytest.raises(TargetError, match=r"needs .* more on .* which has .* free"):
            run(hub, tmp_path / "hub")
        assert hub.served == {}


def test_the_token_goes_as_a_header_and_a_wrong_one_is_said_in_one_line(tmp_path: Path) -> None:
    repo = tiny_repo(REPO, 10_000)
    with HubStub(repo) as hub:
        hub.token = "hf_secret_value_123"
        with pytest.raises(TargetError, match="HTTP 401.*HF_TOKEN"):
            run(hub, tmp_path / "hub", token="hf_wrong")
        got, _ = run(hub, tmp_path / "hub", token="hf_secret_value_123")
        assert got.commit == repo.commit


def test_a_revision_the_hub_does_not_have_is_said_in_one_line(tmp_path: Path) -> None:
    with HubStub(tiny_repo(REPO, 10_000)) as hub:
        with pytest.raises(TargetError, match="HTTP 404 .no such repo, revision or file."):
            run(hub, tmp_path / "hub", revision="v9")


def profile(tmp_path: Path, engine: str) -> Any:
    path = tmp_path / "p.yaml"
    path.write_text(f"name: w\ntarget: {{host: local}}\nengine:\n{engine}")
    return load_profile(path)


def test_the_profile_pins_the_commit_fetched_and_runs_offline(tmp_path: Path) -> None:
    p = profile(tmp_path, "  model_path: acme/tiny\n  weights: {revision: v1}\n"
                          "  env: {HF_HOME: /data/hf, HF_TOKEN: hf_abcdef}\n")
    got = plan_for(p)
    assert got == WeightsPlan("acme/tiny", "v1", "/data/hf/hub", None, "hf_abcdef")
    pin = pinned(p, "a" * 40)
    assert pin.engine.args["revision"] == "a" * 40 and pin.engine.env["HF_HUB_OFFLINE"] == "1"
    assert pin.engine.weights is not None and pin.engine.weights.revision == "a" * 40
    assert "HF_TOKEN" in pin.secret_env_keys()
    assert plan_for(profile(tmp_path, "  model_path: acme/tiny\n")) is None


@pytest.mark.parametrize("engine, said", [
    ("  model_path: /models/tiny\n  weights: {}\n", "is not one"),
    ("  model_path: acme/tiny\n  weights: {revision: main}\n  args: {revision: v2}\n",
     "set engine.weights.revision instead of args.revision"),
    ("  model_path: acme/tiny\n  weights: {revison: main}\n", "revison"),
])
def test_bad_weights_are_refused_by_the_profile(tmp_path: Path, engine: str, said: str) -> None:
    with pytest.raises(ProfileError, match=said):
        profile(tmp_path, engine)


def test_a_commit_fetched_before_needs_no_hub_a_branch_does(tmp_path: Path) -> None:
    """A rollback (or a pinned commit) to weights already here works while the hub is unreachable."""
    repo = tiny_repo(REPO, 50_000)
    with HubStub(repo) as hub:
        run(hub, tmp_path / "hub")
        endpoint = hub.endpoint
    gone = WeightsPlan(REPO, repo.commit, str(tmp_path / "hub"), endpoint, None)
    got = fetch(LocalRemote(), gone, lambda e: None)
    assert got.commit == repo.commit and got.fetched == 0
    with pytest.raises(TargetError, match="cannot reach"):
        fetch(LocalRemote(), WeightsPlan(REPO, "main", str(tmp_path / "hub"), endpoint, None), lambda e: None)
    blob = next((tmp_path / "hub" / "models--acme--tiny" / "blobs").glob(repo.files[2].sha256))
    blob.unlink()  # a file gone: the hub is asked again (and cannot be reached)
    with pytest.raises(TargetError, match="cannot reach"):
        fetch(LocalRemote(), gone, lambda e: None)


@pytest.mark.parametrize("ends", ["closed", "helper-gone"])
def test_a_fetch_whose_caller_goes_away_ends_and_frees_its_lock(tmp_path: Path, ends: str) -> None:
    """The helper's `fetch` op (a program of its own): closing its session (Ctrl-C on the controller) ends it while
    the conversation goes on; so does the end of the conversation (the controller died: the helper's stdin ends)."""
    from deployer.events import Info
    from deployer.remote.conversation import Conversation

    repo = tiny_repo(REPO, 3_000_000)
    with HubStub(repo) as hub:
        hub.rate = 500_000  # 6 s in all
        conv = Conversation.open(LocalRemote())
        try:
            session = conv.helper.program("fetch")
            session.send(plan(hub, tmp_path / "hub").request(0.05))
            for _ in range(100):  # until bytes flow
                line = session.readline(10)
                assert line is not None
                if '"file": "model.safetensors"' in line:
                    break
            if ends == "closed":
                session.close()  # Ctrl-C on the controller: the op's session goes, the conversation stays
            else:
                conv.close()     # the controller is gone: the helper ends, and its program with it
            time.sleep(1.0)
            still = dict(hub.served)
            time.sleep(1.0)
            assert hub.served == still  # the fetch ended with its caller: nothing more was sent
            hub.rate = 0
            seen: list[Event] = []
            again = conv if ends == "closed" else Conversation.open(LocalRemote())
            got = fetch(again, plan(hub, tmp_path / "hub"), seen.append)
            assert got.commit == repo.commit
            assert not [e for e in seen if isinstance(e, Info) and "waiting" in e.message]  # the first one had ended
            assert got.fetched < 3_000_000  # it resumed from what had arrived
            assert again.starts == 1   # one helper each: the fetches were its ops
            again.close()
        finally:
            conv.close()


def test_plan_says_what_the_fetch_would_take_and_fetches_nothing(tmp_path: Path) -> None:
    from deployer.box.weights import needed

    repo = tiny_repo(REPO, 100_000)
    with HubStub(repo) as hub:
        need = needed(LocalRemote(), plan(hub, tmp_path / "hub"))
        assert need.commit == repo.commit and need.total == need.missing == repo.total and need.fits
        assert hub.served == {}
        assert "to fetch" in need.describe() and "(fits)" in need.describe()
        run(hub, tmp_path / "hub")
        assert needed(LocalRemote(), plan(hub, tmp_path / "hub")).missing == 0
        hub.lie = {"model.safetensors": 1 << 60}
        assert "DOES NOT FIT" in needed(LocalRemote(), plan(hub, tmp_path / "hub")).describe()


def test_a_redirect_to_another_host_is_followed_without_the_token(tmp_path: Path) -> None:
    repo = tiny_repo(REPO, 20_000)
    with HubStub(repo) as hub, HubStub(repo) as cdn:
        hub.token = "hf_secret_value_123"
        hub.cdn = cdn.endpoint  # another port: another host for the redirect
        got, _ = run(hub, tmp_path / "hub", token="hf_secret_value_123")
        assert got.commit == repo.commit and sum(cdn.served.values()) == repo.total
        assert all(r.startswith("/cdn/") for r in cdn.requests) and set(cdn.auth_seen) == {None}


def parted(hub: HubStub, cache: Path, connections: int = 4) -> tuple[Any, list[Event]]:
    """A fetch whose large files come in parts of 200 kB, `connections` at a time."""
    seen: list[Event] = []
    plan = WeightsPlan(REPO, "main", str(cache), hub.endpoint, None, connections=connections, part_bytes=200_000)
    return fetch(LocalRemote(), plan, seen.append, progress_s=0.05), seen


def test_a_large_file_comes_in_parts_at_once_and_lands_whole(tmp_path: Path) -> None:
    repo = tiny_repo(REPO, 1_000_000)
    weights = next(f for f in repo.files if f.name == "model.safetensors")
    with HubStub(repo) as hub:
        hub.rate = 400_000  # per transfer: five parts at once take a fifth of one stream's time
        got, _ = parted(hub, tmp_path / "hub")
        assert got.fetched == repo.total and hub.most_in_flight >= 3, hub.most_in_flight
        asked = sorted((a, b) for name, a, b in hub.ranges_asked if name == "model.safetensors")
        assert asked == [(k * 200_000, k * 200_000 + 199_999) for k in range(5)]
        blobs = tmp_path / "hub" / "models--acme--tiny" / "blobs"
        assert (blobs / weights.sha256).read_bytes() == weights.data
        assert not [p for p in blobs.iterdir() if ".deployer-parts" in p.name or p.name.endswith(".incomplete")]


def test_a_parted_fetch_that_broke_resumes_every_part_where_it_stopped(tmp_path: Path) -> None:
    repo = tiny_repo(REPO, 1_000_000)
    weights = next(f for f in repo.files if f.name == "model.safetensors")
    with HubStub(repo) as hub:
        hub.cut_after, hub.cuts = 50_000, 999   # every transfer of a part is cut after 50 kB, three times each
        with pytest.raises(TargetError, match="broke off"):
            parted(hub, tmp_path / "hub")
        record = tmp_path / "hub" / "models--acme--tiny" / "blobs" / f"{weights.sha256}.deployer-parts.json"
        per_part = json.loads(record.read_text())["got"]
        kept = sum(per_part)
        assert 0 < kept < len(weights.data) and len(per_part) == 5, per_part
        hub.cuts, hub.ranges_asked = 0, []
        got, _ = parted(hub, tmp_path / "hub")
        assert got.fetched == len(weights.data) - kept  # what had arrived was not asked for again
        # each part from where it stopped (a part no worker had reached when the fetch gave up starts at its start)
        resumed = sorted((start, last) for _, start, last in hub.ranges_asked)
        assert resumed == [(k * 200_000 + n, k * 200_000 + 199_999) for k, n in enumerate(per_part) if n < 200_000], \
            (resumed, per_part)
        blob = tmp_path / "hub" / "models--acme--tiny" / "blobs" / weights.sha256
        assert blob.read_bytes() == weights.data


def test_a_hub_that_ignores_ranges_gets_one_stream(tmp_path: Path) -> None:
    repo = tiny_repo(REPO, 1_000_000)
    weights = next(f for f in repo.files if f.name == "model.safetensors")
    with HubStub(repo) as hub:
        hub.ranges = False
        got, _ = parted(hub, tmp_path / "hub")
        assert got.fetched == repo.total and hub.most_in_flight == 1
        assert (tmp_path / "hub" / "models--acme--tiny" / "blobs" / weights.sha256).read_bytes() == weights.data


@pytest.mark.parametrize("connections", [1, 4])
def test_a_file_whose_bytes_do_not_match_the_listed_sha256_is_refused_and_not_published(
        tmp_path: Path, connections: int) -> None:
    """One stream (the file's .incomplete) and parts at once (its .deployer-parts): the whole file arrives with its
    listed size but one byte changed; the fetch fails saying so, nothing of it is left where an engine looks, and
    the next fetch (the hub sending the right bytes) asks for the whole file again."""
    repo = tiny_repo(REPO, 1_000_000)
    weights = next(f for f in repo.files if f.name == "model.safetensors")
    with HubStub(repo) as hub:
        hub.corrupt = {"model.safetensors"}
        with pytest.raises(TransferFailed, match="model.safetensors: its sha256 is not the one the hub listed"):
            parted(hub, tmp_path / "hub", connections=connections)
        assert hub.served["model.safetensors"] == len(weights.data)
        folder = tmp_path / "hub" / "models--acme--tiny"
        left = [p.name for p in (folder / "blobs").iterdir() if p.name.startswith(weights.sha256)]
        assert left in ([], [f"{weights.sha256}.deployer-parts.json"]), left  # a record of parts, of no file
        assert not (folder / "snapshots" / repo.commit / "model.safetensors").exists()
        assert not (folder / "refs" / "main").exists()
        hub.corrupt = set()
        got, _ = parted(hub, tmp_path / "hub", connections=connections)  # the right bytes: fetched whole, again
        assert got.fetched == len(weights.data)
        assert (folder / "snapshots" / repo.commit / "model.safetensors").read_bytes() == weights.data
