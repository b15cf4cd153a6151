"""The waits and caps every stop and start of a run shares (single host, node group, router)."""

from __future__ import annotations

PORT_WAIT_S = 15.0          # for the port to free after a stop (a just-stopped server can hold it a while)
RETRY_PORT_WAIT_S = 5.0     # before a later attempt: this run's own engine just stopped
STOP_GRACE_CAP_S = 10.0     # a stop during `up` waits at most this long for a graceful exit


def stop_grace(grace_s: float) -> float:
    """The profile's restart grace, capped: `up` does not wait a long grace for an engine it replaces."""
    return min(grace_s, STOP_GRACE_CAP_S)
