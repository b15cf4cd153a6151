"""A worker smg was asked to add before it answered: its pending creation job, and when to ask again.

smg (1.13.0, checked against the real binary) takes `POST /workers` as a background job that checks the worker's
health every `--worker-startup-check-interval` (30 s by default) until it answers; meanwhile every POST of that URL
is 409 "Worker creation already in progress ... with ID <id>". A replica asked back into the router while its
brought-back engine was still loading was therefore listed up to 30 s after it answered (issue 34: 34-38 s after a
killed restart). The job can be deleted (`DELETE /workers/<id>`, 202): once the worker answers its health check,
the stale job is deleted and the worker POSTed again, and the new job's first check finds it serving.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from deployer.remote.base import EndpointUnreachable, Remote

WORKER_HEALTH_PATH = "/health"  # smg's default --health-check-endpoint
HEALTH_TIMEOUT_S = 2.0
_PENDING_ID = re.compile(r"with ID ([0-9A-Za-z_-]{1,128})")


def pending_id(answer: Any) -> str | None:
    """The id of the creation job a 409 "creation already in progress" names (None when it names none)."""
    text = answer.get("error") if isinstance(answer, dict) else answer
    found = _PENDING_ID.search(str(text or ""))
    return found.group(1) if found else None


def worker_answers(remote: Remote, url: str, api_key: str | None) -> bool:
    """Whether the worker at `url` answers its health check now, asked from the router's host (as smg asks it)."""
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return False
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        reply = remote.request("GET", port, WORKER_HEALTH_PATH, headers=headers, timeout=HEALTH_TIMEOUT_S,
                               address=parts.hostname or "127.0.0.1")
    except EndpointUnreachable:
        return False
    return reply.status == 200
