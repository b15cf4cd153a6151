"""Whether the nodes of a group reach each other before anything starts: node 0 listens on its dist-init port for a
moment (`listen`), each follower connects to it over the network the engine will use (`reach`). The helper answers
both, one thread each, so node 0 listens while the followers try. Stdlib only, Python >= 3.8 (runs on the target).

    listen {port, peers, timeout_s}      listen on 0.0.0.0:port until `peers` connections came or `timeout_s`
                                         passed                                          -> {accepted: N}
    reach {address, port, timeout_s}     connect to address:port, again every 0.2 s until `timeout_s`
                                         -> {reached: bool, error: str | null}  (error: the last attempt's)
"""

from __future__ import annotations

import socket
import time
from typing import Any, Dict

CONNECT_TIMEOUT_S = 2.0
RETRY_S = 0.2


class BindRefused(Exception):
    kind = "bind"


def listen(req: Dict[str, Any]) -> Dict[str, Any]:
    port, peers, timeout_s = int(req["port"]), int(req["peers"]), float(req["timeout_s"])
    sock = socket.socket()
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError as e:
            raise BindRefused("cannot listen on port %d: %s" % (port, e.strerror or e)) from None
        sock.listen(64)
        sock.settimeout(RETRY_S)
        accepted, end = 0, time.monotonic() + timeout_s
        while accepted < peers and time.monotonic() < end:
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            conn.close()
            accepted += 1
        return {"accepted": accepted}
    finally:
        sock.close()


def reach(req: Dict[str, Any]) -> Dict[str, Any]:
    address, port, timeout_s = str(req["address"]), int(req["port"]), float(req["timeout_s"])
    end = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((address, port), timeout=CONNECT_TIMEOUT_S).close()
            return {"reached": True, "error": None}
        except OSError as e:
            if time.monotonic() >= end:
                return {"reached": False, "error": str(e)}
            time.sleep(RETRY_S)
