"""Downtime of a replace whose new version needs a download (issue 25): fetch-before-stop (`engine.weights`) against
the old order, where the new engine downloads its weights itself after the old version was stopped.

Both move the same bytes from the same local stand-in of the hub (tests/standin/hubstub.py) at the same rate:
a new revision of a generated tiny repo (`--weights-mb`, served at `--rate-mbs`). The baseline's new engine is the
stand-in in mode `download_hub` (it GETs every file from HF_ENDPOINT while it loads); deployer's is launched
offline after deployer fetched the files. A client polls the serving version's /health every 50 ms from the start
of the replacing `deploy up` to its end: failed polls, and the longest stretch without an answer (seconds without
a serving engine). Runs alternate.
"""

from __future__ import annotations

import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from common import Figure, bench_profile, deploy_env, median, timed
from sshbed import SSHD, free_port  # noqa: E402  (tests/ is on the path: common.py)
from standin.hubstub import HubStub, tiny_repo  # noqa: E402

DEPLOY = [sys.executable, "-m", "deployer.cli"]
REPO_ID = "acme/tiny"


def _poll(port: int, stop: threading.Event, seen: list[tuple[float, bool]]) -> None:
    deadline = time.monotonic() + 600
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as resp:
                ok = resp.status == 200
        except OSError:
            ok = False
        seen.append((time.monotonic(), ok))
        time.sleep(0.05)


def outage(seen: list[tuple[float, bool]]) -> tuple[int, float]:
    """Failed polls, and the longest stretch from a failed poll to the next answered one."""
    failed = sum(1 for _, ok in seen if not ok)
    longest, began = 0.0, None
    for at, ok in seen:
        if not ok and began is None:
            began = at
        elif ok and began is not None:
            longest, began = max(longest, at - began), None
    if began is not None:
        longest = max(longest, seen[-1][0] - began)
    return failed, longest


def _replace(bed: SSHD, tmp: Path, hub: HubStub, *, fetch: bool, rep: int, mb: float) -> tuple[int, float, float]:
    """One deployment up on v1, then a replace onto a new revision while the poll runs: failed, outage, up's time."""
    name = f"w{'f' if fetch else 'e'}{rep}"
    port = free_port()
    hf = tmp / f"hf-{name}"
    env = {"HF_HOME": str(hf), "HF_ENDPOINT": hub.endpoint}
    extra: dict[str, Any] = {"engine": {"weights": {}}} if fetch else {}
    prof = bench_profile(tmp, bed, name, env, model=REPO_ID, port=port, extra=extra)
    home = tmp / f"home-{name}"
    hub.rate = 0
    hub.publish(tiny_repo(REPO_ID, 200_000, seed=f"{name}-v1"))
    timed([*DEPLOY, "up", str(prof), "--skip-preflight"], env=deploy_env(home), timeout=180)
    hub.publish(tiny_repo(REPO_ID, int(mb * 1e6), seed=f"{name}-v2"))
    hub.rate = RATE["bytes_s"]
    if not fetch:  # the new version downloads by itself, after the old one was stopped
        prof = bench_profile(tmp, bed, name, {**env, "STANDIN_MODE": "download_hub"}, model=REPO_ID, port=port)
    stop, seen = threading.Event(), []
    poller = threading.Thread(target=_poll, args=(port, stop, seen), daemon=True)
    poller.start()
    try:
        took, _ = timed([*DEPLOY, "up", str(prof), "--skip-preflight"], env=deploy_env(home), timeout=300)
    finally:
        stop.set()
        poller.join(timeout=5)
        timed([*DEPLOY, "down", str(prof)], env=deploy_env(home), check=False)
    failed, longest = outage(seen)
    return failed, longest, took


RATE = {"bytes_s": 1_000_000}


def run(bed: SSHD, tmp: Path, reps: int, *, mb: float = 4.0, rate_mbs: float = 1.0) -> list[Figure]:
    RATE["bytes_s"] = int(rate_mbs * 1e6)
    got: dict[bool, list[tuple[int, float, float]]] = {True: [], False: []}
    with HubStub() as hub:
        for rep in range(reps):
            for fetch in (False, True):   # alternated: load drift hits both
                got[fetch].append(_replace(bed, tmp, hub, fetch=fetch, rep=rep, mb=mb))
    download_s = mb / rate_mbs
    seconds = Figure("replace needing a download: seconds not serving", median([g[1] for g in got[True]]), "s",
                     median([g[1] for g in got[False]]), "the engine downloads after the stop",
                     f"stop + load only (download {download_s:.1f} s outside)",
                     samples=[g[1] for g in got[True]], baseline_samples=[g[1] for g in got[False]])
    seconds.ok = seconds.value < download_s / 2
    failed = Figure("replace needing a download: failed polls (50 ms)", median([g[0] for g in got[True]]), "polls",
                    median([g[0] for g in got[False]]), "the engine downloads after the stop", "",
                    samples=[float(g[0]) for g in got[True]], baseline_samples=[float(g[0]) for g in got[False]],
                    notes=f"{mb:g} MB at {rate_mbs:g} MB/s; `deploy up` took {median([g[2] for g in got[True]]):.1f}"
                          f" s (fetch first) vs {median([g[2] for g in got[False]]):.1f} s")
    return [seconds, failed]
