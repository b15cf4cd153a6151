"""What a running engine serves, for `status` and `top`: its own /metrics and the GPUs' memory (nvidia-smi), read
through the target's helper in the same conversation as the rest of a status, and the previous scrape kept
locally so that rates (tokens/s) and interval latencies cover the time since the last look.

The health check, the /metrics request and nvidia-smi go out together (the helper answers requests concurrently):
one round trip for all three. The previous scrape of each run (keyed by host and run dir) is kept under
DEPLOYER_HOME/cache/metrics/ for at most PREVIOUS_MAX_AGE_S; the first look (or one after a long pause) has no
interval: its rates are absent and its latencies cover the engine's whole life (`window: since_start`).

What the engine does not expose stays absent (null), never 0 (deployer.observe.serving). A /metrics the engine
does not serve (an engine whose metrics are switched off by a flag) says so with the profile change
that turns it on (the engine's metrics switch).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployer.engines import Engine
from deployer.errors import DeployError
from deployer.local.history import home
from deployer.observe.names import MetricNames, MetricNamesUnreadable, load_metric_names
from deployer.observe.prometheus import MetricsUnreadable, Scrape, parse
from deployer.observe.serving import ServingMetrics
from deployer.remote.base import EndpointUnreachable, Remote

PREVIOUS_MAX_AGE_S = 900.0
"""A kept scrape older than this is not an interval's start: rates over an hour say little about now."""
CACHE_MAX_BYTES = 4 << 20
METRICS_TIMEOUT_S = 5.0
GPU_QUERY = "nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits"


@dataclass(frozen=True)
class Endpoint:
    """Where the target reaches a run's server, and which run it is (the key of its kept scrape)."""

    port: int
    address: str
    health_path: str
    run_dir: str
    gpus: list[int] | None = None        # the profile's GPU indices (None: every GPU of the box)


@dataclass(frozen=True)
class Looked:
    """One look at a running server: /health, and (when asked) its serving metrics as the status row shows them."""

    healthy: bool
    metrics: dict[str, Any] | None = None


def look(remote: Remote, engine: Engine, where: Endpoint, with_metrics: bool = True,
         args: Mapping[str, Any] | None = None) -> Looked:
    """/health, /metrics and nvidia-smi in one round trip (three concurrent requests to the helper). `args`: the
    engine args the run was started with (None: not known, /metrics is asked); when they turn its metrics off, /metrics is not asked (each ask was a
    `GET /metrics 404` line in the engine's log) and the row says "metrics off" with the fix."""
    if not with_metrics:
        return Looked(_healthy(remote, where))
    off = metrics_off(engine, args) if args is not None else None
    with ThreadPoolExecutor(max_workers=3) as pool:
        health = pool.submit(_healthy, remote, where)
        scrape = None if off is not None else pool.submit(_scrape, remote, where)
        gpus = pool.submit(_gpu_memory, remote, where.gpus)
        if scrape is None:
            return Looked(health.result(), {"off": True, "error": f"metrics off ({off})", "gpu_memory": gpus.result()})
        return Looked(health.result(), _metrics_row(engine, where, remote.label, scrape.result(), gpus.result()))


def metrics_off(engine: Engine, args: Mapping[str, Any]) -> str | None:
    """The fix (as the engine's metrics.yaml says it) when these engine args turn its /metrics series off, else
    None (on, or no switch known)."""
    names = _names(engine)
    switch = names.switch if names is not None else None
    return switch.fix if switch is not None and not switch.serves(args) else None


def _healthy(remote: Remote, where: Endpoint) -> bool:
    try:
        return remote.request("GET", where.port, where.health_path, timeout=5.0, address=where.address).status == 200
    except EndpointUnreachable:
        return False


@dataclass(frozen=True)
class _Answer:
    """What /metrics answered: its text and when, or why there is none."""

    text: str | None
    at: float
    error: str | None = None


def _scrape(remote: Remote, where: Endpoint) -> _Answer:
    try:
        reply = remote.request("GET", where.port, "/metrics", timeout=METRICS_TIMEOUT_S, address=where.address)
    except EndpointUnreachable as e:
        return _Answer(None, time.time(), e.message)
    if reply.status != 200:
        return _Answer(None, time.time(), f"/metrics answered HTTP {reply.status}")
    return _Answer(reply.body.decode("utf-8", "replace"), time.time())


def _gpu_memory(remote: Remote, gpus: list[int] | None) -> list[dict[str, Any]] | None:
    """Each GPU's memory used and total (MiB) from nvidia-smi; None when the box has none or it fails."""
    try:
        result = remote.run(f"command -v nvidia-smi >/dev/null && {GPU_QUERY}", timeout=10.0, check=False)
    except DeployError:
        return None
    if not result.ok:
        return None
    rows = []
    for line in result.stdout.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 3 or not all(c.isdigit() for c in cells):
            continue
        index, used, total = (int(c) for c in cells)
        if gpus is None or index in gpus:
            rows.append({"index": index, "used_mib": used, "total_mib": total})
    return rows or None


def _metrics_row(engine: Engine, where: Endpoint, host: str, answer: _Answer,
                 gpus: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The row's `metrics`: the ServingMetrics as JSON plus `gpu_memory`, or `error` (and `gpu_memory`)."""
    names = _names(engine)
    if names is None:
        return {"error": f"{engine.kind}: no metric names known", "gpu_memory": gpus}
    if answer.text is None:
        return {"error": _why_none(names, answer.error or ""), "gpu_memory": gpus}
    try:
        now = Scrape(answer.at, parse(answer.text))
    except MetricsUnreadable as e:
        return {"error": f"/metrics is not Prometheus text: {e}", "gpu_memory": gpus}
    key = _cache_key(host, where.run_dir)
    before = _kept(key, answer.at)
    _keep(key, answer)
    snapshot = ServingMetrics.from_scrapes(names, now, before)
    return {**snapshot.to_json(), "summary": snapshot.summary(), "gpu_memory": gpus}


def _names(engine: Engine) -> MetricNames | None:
    path = engine.knowledge.metrics
    return _names_in(path) if path is not None else None


@functools.lru_cache(maxsize=8)
def _names_in(path: Path) -> MetricNames | None:
    """An engine's map, read once per process (`top` looks again every few seconds)."""
    try:
        return load_metric_names(path)
    except MetricNamesUnreadable:
        return None


def _why_none(names: MetricNames, error: str) -> str:
    switch = names.switch
    return f"{error}; {switch.fix}" if switch is not None and "404" in error else error


# -- the previous scrape, kept locally ---------------------------------------------------------------------------

def _cache_dir() -> Path:
    return home() / "cache" / "metrics"


def _cache_key(host: str, run_dir: str) -> str:
    return hashlib.sha256(f"{host}\0{run_dir}".encode()).hexdigest()[:32]


def _kept(key: str, now: float) -> Scrape | None:
    """The scrape kept from the last look at this run, when it is recent enough to start an interval."""
    try:
        data = json.loads((_cache_dir() / f"{key}.json").read_text(encoding="utf-8"))
        at, text = float(data["at"]), str(data["text"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not 0 < now - at <= PREVIOUS_MAX_AGE_S:
        return None
    try:
        return Scrape(at, parse(text))
    except MetricsUnreadable:
        return None


def _keep(key: str, answer: _Answer) -> None:
    """This scrape, for the next look (written whole or not at all; a failure to write costs only the rates)."""
    if answer.text is None or len(answer.text) > CACHE_MAX_BYTES:
        return
    folder = _cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key}.")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump({"at": answer.at, "text": answer.text}, out)
        os.replace(tmp, folder / f"{key}.json")
    except OSError:
        pass

