"""A status row's serving metrics (deployer.operate.serving) for people: the engine's one-line summary, the GPUs'
memory, or why there are none."""

from __future__ import annotations

from typing import Any


def serving_lines(metrics: dict[str, Any] | None) -> list[str]:
    """"serving: 2 running, 0 waiting, KV 3.1%; ..." and "gpu memory: 0 70123/143771 MiB"; nothing when the row has
    no metrics (not alive, or a node whose engine does not serve the API)."""
    if not metrics:
        return []
    lines = [f"serving: {metrics['summary']}" if metrics.get("summary") else
             f"serving: {metrics['error']}" if metrics.get("off") else
             f"serving: no metrics ({metrics.get('error') or 'none read'})"]
    gpus = metrics.get("gpu_memory")
    if gpus:
        lines.append("gpu memory: " + ", ".join(f"GPU {g['index']} {g['used_mib']}/{g['total_mib']} MiB" for g in gpus))
    return lines
