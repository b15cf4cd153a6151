"""Progress is bytes, not lines: tqdm bars read back (checked against the real tqdm), the bounded log reader, and
the watch telling a moving download from a frozen bar (on real files through LocalRemote, with a test clock)."""

from __future__ import annotations

import io
import json
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import tqdm

from deployer.engines import engine_for
from deployer.profile.model import Health
from deployer.watch.progress import parse
from deployer.box.push import RunDir
from deployer.remote.local import LocalRemote
from deployer.box.process import Launch
from deployer.watch.watcher import PARTIAL_KEEP, Event, Hung, LogTail, Watcher

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "standin"))
from sglang.srt.standin_download import format_bar  # noqa: E402  (the stand-in engine's bar)

SIZES = [0, 1, 999, 1000, 9_994, 99_949, 512_000, 1_650_000_000, 4_970_000_000, 5e12]


@pytest.mark.parametrize("total", [4_970_000_000, 1_000, 123_456_789_012])
@pytest.mark.parametrize("frac", [0.0, 0.004, 0.333, 0.5, 0.999, 1.0])
@pytest.mark.parametrize("elapsed", [0, 0.4, 12.3, 3_725.0])
def test_the_standin_draws_exactly_what_tqdm_draws(total: int, frac: float, elapsed: float) -> None:
    n = int(total * frac)
    real = tqdm.tqdm.format_meter(n, total, elapsed, unit="B", unit_scale=True, prefix="model-00001.safetensors")
    assert format_bar("model-00001.safetensors", n, total, elapsed) == real


@pytest.mark.parametrize("n", SIZES)
def test_byte_bars_from_real_tqdm_read_back(n: float) -> None:
    total = 5e12
    text = tqdm.tqdm.format_meter(n, total, 7.5, unit="B", unit_scale=True, prefix="model-00003-of-00011.safetensors")
    bar = parse(text)
    assert bar is not None and bar.is_download and bar.file == "model-00003-of-00011.safetensors"
    assert bar.total == total and bar.percent == int(f"{n / total * 100:3.0f}")
    assert bar.n == pytest.approx(n, rel=0.006, abs=0.01)  # tqdm prints 3 significant digits
    if n:
        assert bar.rate == pytest.approx(n / 7.5, rel=0.006)


def test_other_real_tqdm_forms_read_back() -> None:
    no_total = parse(tqdm.tqdm.format_meter(1_650_000_000, None, 12.3, unit="B", unit_scale=True,
                                            prefix="model.safetensors"))
    assert no_total is not None and no_total.is_bytes and no_total.total is None and no_total.n == 1.65e9
    fetching = parse(tqdm.tqdm.format_meter(2, 11, 10.3, prefix="Fetching 11 files"))
    assert fetching is not None and fetching.is_download and (fetching.n, fetching.total) == (2, 11)
    shards = parse(tqdm.tqdm.format_meter(
        5, 11, 3, prefix="Loading safetensors checkpoint shards",
        bar_format="{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, "
                   "{rate_fmt}{postfix}]"))
    assert shards is not None and not shards.is_download and shards.percent == 45
    long_name = parse(tqdm.tqdm.format_meter(0, 4.97e9, 0, unit="B", unit_scale=True,
                                             prefix="(…)Qwen3.6-35B-A3B/model-00001-of-00011.safetensors"))
    assert long_name is not None and long_name.rate is None and long_name.file.endswith("of-00011.safetensors")
    for line in ["[2026-11-30 10:00:00] Load weight begin. avail mem=139.80 GB", "50%", "ratio: 50% [x]", ""]:
        assert parse(line) is None


def _tqdm_stream(updates: list[int], total: int) -> bytes:
    out = io.StringIO()
    bar = tqdm.tqdm(total=total, unit="B", unit_scale=True, desc="model-00001-of-00002.safetensors", file=out,
                    mininterval=0, miniters=1)
    for step in updates:
        bar.update(step)
    return out.getvalue().encode()


def test_logtail_hands_on_the_redrawn_bar_of_real_tqdm_output(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"[2026-11-30] Load weight begin. avail mem=139.80 GB\n")
    tail = LogTail(LocalRemote(), str(log))
    assert tail.update().lines == ["[2026-11-30] Load weight begin. avail mem=139.80 GB"]
    with log.open("ab") as f:
        f.write(_tqdm_stream([10_000_000] * 3, 100_000_000))
    update = tail.update()
    assert update.lines == [] and update.screen is not None
    bar = parse(update.screen)
    assert bar is not None and bar.n == 30_000_000 and bar.percent == 30
    assert tail.partial.count(b"\r") == 1  # only the last redraw is held


def test_a_10mb_line_without_newline_is_read_in_bounded_memory_and_time(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"")
    tail = LogTail(LocalRemote(), str(log))
    tracemalloc.start()
    began = time.monotonic()
    for _ in range(20):  # written slowly, read as it grows
        with log.open("ab") as f:
            f.write(b"x" * (512 << 10))
        tail.update()
        assert len(tail.partial) <= PARTIAL_KEEP
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert time.monotonic() - began < 5
    assert peak < 8 << 20  # one bounded read (1 MB) plus the held part, not the 10 MB line
    with log.open("ab") as f:
        f.write(b"\nnext\n")
    lines = tail.update().lines
    assert lines[-1] == "next" and len(lines[0]) < 10_000 and "bytes cut]" in lines[0]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _watcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stall_s: float) -> tuple[Watcher, list[Event],
                                                                                             Clock, Path]:
    monkeypatch.setattr("deployer.watch.watcher.status", lambda remote, run: {"status": "running"})
    run = RunDir(str(tmp_path), "run-1")
    (tmp_path / "state.json").write_text(json.dumps({"status": "running"}))
    log = tmp_path / "engine.log"
    log.write_bytes(b"")
    events: list[Event] = []
    clock = Clock()
    health = Health(interval_s=0.2, startup_timeout_s=10_000, stall_timeout_s=stall_s)
    watcher = Watcher(LocalRemote(), Launch(run, 1, 1, time.time(), 0), 1, health, engine_for("sglang"),
                      events.append, clock=clock)
    return watcher, events, clock, log


def _draw(log: Path, desc: str, n: float, total: float, elapsed: float) -> None:
    with log.open("a", encoding="utf-8") as f:
        f.write("\r" + format_bar(desc, n, total, elapsed))


def test_a_download_longer_than_the_stall_timeout_is_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    watcher, events, clock, log = _watcher(tmp_path, monkeypatch, stall_s=3)
    log.write_text("[2026-11-30 10:00:00] Load weight begin. avail mem=139.80 GB\n")
    assert watcher.poll_once() is None
    total = 4.97e9
    for second in range(1, 31):  # 30 s of download against a 3 s stall timeout, one redraw a second
        clock.now += 1
        _draw(log, "model-00001-of-00011.safetensors", total * second / 30, total, second)
        assert watcher.poll_once() is None, f"killed as hung after {second}s of download"
    phases = [e.data["phase"] for e in events if e.kind == "phase"]
    assert phases == ["loading weights", "downloading"]
    last = [e.data for e in events if e.kind == "progress"][-1]
    assert last["file"] == "model-00001-of-00011.safetensors" and last["percent"] == 100
    assert last["bytes"] == pytest.approx(total, rel=0.01) and last["total_bytes"] == pytest.approx(total, rel=0.01)
    assert last["rate_bytes_s"] == pytest.approx(total / 30, rel=0.01)


@pytest.mark.parametrize("redraw", ["same text", "clock advances", "nothing"])
def test_a_frozen_bar_is_still_a_stall(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redraw: str) -> None:
    watcher, events, clock, log = _watcher(tmp_path, monkeypatch, stall_s=3)
    total = 4.97e9
    for second in range(1, 6):
        clock.now += 1
        _draw(log, "model-00001-of-00011.safetensors", total * second / 30, total, second)
        assert watcher.poll_once() is None
    outcome: Any = None
    for second in range(6, 20):  # the count stays at 5/30
        clock.now += 1
        if redraw != "nothing":
            _draw(log, "model-00001-of-00011.safetensors", total * 5 / 30, total, 5 if redraw == "same text" else second)
        outcome = watcher.poll_once()
        if outcome is not None:
            break
    assert isinstance(outcome, Hung), outcome
    assert 3 < outcome.stalled_s <= 5 and "17%" in outcome.tail[-1]
    assert "did not move" in outcome.describe()


def test_other_output_that_changes_is_progress_and_the_same_line_redrawn_is_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    watcher, _, clock, log = _watcher(tmp_path, monkeypatch, stall_s=3)
    for second in range(1, 8):  # a spinner-like unfinished line that changes: progress
        clock.now += 1
        with log.open("a") as f:
            f.write(f"\rcompiling kernels {second}")
        assert watcher.poll_once() is None
    outcome = None
    for _ in range(8):  # the same unfinished text redrawn: not progress
        clock.now += 1
        with log.open("a") as f:
            f.write("\rcompiling kernels 7")
        outcome = watcher.poll_once()
        if outcome is not None:
            break
    assert isinstance(outcome, Hung)


def test_the_hub_cache_folder_of_a_model(tmp_path: Path) -> None:
    from deployer.watch.hubcache import hub_cache

    assert hub_cache("/models/qwen", {}) is None and hub_cache("./qwen", {}) is None
    default = hub_cache("Qwen/Qwen3.6-27B", {})
    assert default is not None and default.folder_name == "models--Qwen--Qwen3.6-27B"
    assert "${HF_HUB_CACHE:-${HF_HOME:-$HOME/.cache/huggingface}/hub}" in default.command()
    home = hub_cache("Qwen/Qwen3-8B", {"HF_HOME": "~/hf"})
    assert home is not None and home.hub == '"$HOME"/hf/hub'
    blobs = tmp_path / "hub" / "models--Qwen--Qwen3-8B" / "blobs"
    blobs.mkdir(parents=True)
    cache = hub_cache("Qwen/Qwen3-8B", {"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert cache is not None
    with (blobs / "a.incomplete").open("wb") as f:
        f.truncate(5_000_000_000)  # sizes past 2**31 must add up (awk's %d would cap them)
    (blobs / "b").write_bytes(b"x" * 10)
    assert cache.size(LocalRemote()) == 5_000_000_010


def test_a_long_line_is_not_taken_for_a_bar_and_costs_nothing() -> None:
    began = time.monotonic()
    assert parse("x: 1" + "y" * 100_000 + " [00:01, 1B/s]") is None
    assert parse(":1" * 50_000 + "[") is None
    assert time.monotonic() - began < 0.5


RSS_PROBE = """
import os, resource, sys
from deployer.remote.local import LocalRemote
from deployer.watch.watcher import LogTail
log = sys.argv[1]
tail = LogTail(LocalRemote(), log)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
chunk = b"z" * (1 << 20)
for _ in range(150):
    with open(log, "ab") as f:
        f.write(chunk)
    tail.update()
print(base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def test_a_slowly_written_150mb_line_does_not_grow_the_reader(tmp_path: Path) -> None:
    """The issue's case: a 150 MB line written as it is read took `up` to 189 MB RSS (before: 486 MB here)."""
    import subprocess

    log = tmp_path / "engine.log"
    log.write_bytes(b"")
    out = subprocess.run([sys.executable, "-c", RSS_PROBE, str(log)], capture_output=True, text=True, timeout=120,
                         cwd=str(Path(__file__).resolve().parents[2]))
    assert out.returncode == 0, out.stderr
    base_kb, peak_kb = map(int, out.stdout.split())
    assert peak_kb - base_kb < 24 << 10, (base_kb, peak_kb)
