"""A link with latency for the benchmarks: an ssh ProxyCommand that relays stdin/stdout to HOST:PORT and holds
every chunk DELAY seconds in each direction (a round trip costs 2 x DELAY), as a real network would.

    ProxyCommand python3 bench/link.py %h %p 0.025      # ~50 ms round trips

Both the OpenSSH baselines and deployer go through it (bench/run.py --delay), so every round trip a command makes
is paid on both sides, as on a GPU box in another region.
"""

from __future__ import annotations

import os
import queue
import socket
import sys
import threading
import time
from typing import Callable


def _relay(read: Callable[[], bytes], write: Callable[[bytes], None], delay: float) -> None:
    """Move chunks from read to write, each released `delay` after it arrived (order kept); EOF ends the process."""
    held: queue.Queue[tuple[float, bytes]] = queue.Queue()

    def release() -> None:
        while True:
            due, data = held.get()
            time.sleep(max(0.0, due - time.monotonic()))
            if not data:
                os._exit(0)
            write(data)

    threading.Thread(target=release, daemon=True).start()
    while True:
        data = read()
        held.put((time.monotonic() + delay, data))
        if not data:
            return


def main(argv: list[str]) -> None:
    host, port, delay = argv[0], int(argv[1]), float(argv[2])
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out = sys.stdout.buffer

    def to_client(data: bytes) -> None:
        out.write(data)
        out.flush()

    threading.Thread(target=_relay, args=(lambda: sock.recv(65536), to_client, delay), daemon=True).start()
    _relay(lambda: os.read(0, 65536), sock.sendall, delay)
    while True:  # the client closed its side: the server's last words still travel, then EOF exits
        time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1:])
