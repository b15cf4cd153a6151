"""STAND-IN for tests: imitates SGLang 0.5.23 (no GPU here); never used by the product.

One engine spread over nodes (`--nnodes N --node-rank R --dist-init-addr HOST:PORT`), as SGLang 0.5.23 runs
it (srt/entrypoints/engine.py `_launch_subprocesses`, srt/distributed/bootstrap.py):

- every node logs `server_args=...` from its main process, then its scheduler ranks log with a ` TP<global
  rank>` prefix (srt/managers/scheduler.py `configure_scheduler_process`: the prefix exists only when
  tp_size > 1; there is no NODE tag). Node R holds TP ranks R*tp/N .. (R+1)*tp/N-1, and the lines of its
  ranks come interleaved in no fixed order.
- rendezvous: torch's `tcp://` init method. The global rank 0 (on node 0) hosts a TCPStore on the dist-init
  port, on every local address, and waits until all `tp_size` ranks joined; the others connect to it,
  retrying. Here one TCP connection per node stands in for the store clients and later for gloo's pairs.
  Timeout: `--dist-timeout`, else torch's default for NCCL (600 s), else env STANDIN_DIST_TIMEOUT_S.
- node 0 then serves the full HTTP API; nodes >= 1 run no tokenizer and no API: only the dummy health
  server (srt/utils/common.py `launch_dummy_health_check_server`: /health, /health_generate, /ping -> 200,
  uvicorn at log level warning, so no access log) on their --host:--port, and they ignore SIGTERM (they
  wait for rank 0's ShutdownReq broadcast).
- a rank that loses a peer fails in its scheduler (gloo broadcast) after STANDIN_PEER_DEATH_DELAY_S, with
  the scheduler-exception / sigquit / SIGKILL sequence, exit 137. STANDIN_PEER_DEATH=stay keeps node 0
  running after a follower died (what sgl-project/sglang#3099 reports for real deployments); =hang keeps
  every rank running after its peer died (a collective that never returns until NCCL's watchdog timeout,
  which the stand-in does not reach).
- a graceful stop of node 0 (SIGTERM) broadcasts the shutdown: the followers exit 0.

Env knobs: STANDIN_DIST_TIMEOUT_S (600), STANDIN_PEER_DEATH_DELAY_S (0.5), STANDIN_PEER_DEATH (die|stay|hang).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import socket
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any, Iterator, List, Optional, Tuple

logger = logging.getLogger("sglang.srt.managers.scheduler")
main_logger = logging.getLogger("sglang.srt.entrypoints.engine")

# torch's default process-group timeout for the NCCL backend (torch.distributed.constants.default_pg_nccl_timeout)
DEFAULT_DIST_TIMEOUT_S = 600
CONNECT_RETRY_S = 0.1
HANG_CAP_S = 3600.0
JOIN, GO, SHUTDOWN = b"JOIN", b"GO", b"SHUTDOWN"
# Gloo's message when the TCP pair to a peer closes (gloo/transport/tcp/pair.cc). The path and line are those
# of real SGLang logs on CUDA wheels of torch 2.x (e.g. "[/pytorch/third_party/gloo/gloo/transport/tcp/
# pair.cc:534] Connection closed by peer [127.0.0.1]:58054" from a TP1 scheduler in broadcast_pyobj); the
# line number moves between torch releases and was not checked against torch 2.13's gloo.
GLOO_PAIR = "/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534"
# glog-style c10d line that precedes the client timeout (socket.cpp:1011 in real logs of torch 2.5-2.7).
C10D_SOCKET = "socket.cpp:1011"


class DistStoreError(RuntimeError):
    """Prints as torch.distributed.DistStoreError in tracebacks, like the real one."""


class DistNetworkError(RuntimeError):
    """Prints as torch.distributed.DistNetworkError in tracebacks, like the real one."""


DistStoreError.__module__ = "torch.distributed"
DistNetworkError.__module__ = "torch.distributed"


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw not in (None, "") else default


class RankFormatter(logging.Formatter):
    """`[time TPn] message`. A record that names its rank (extra tp_prefix) prints once; the others are the
    scheduler step every local rank takes, so they print once per rank, in a random order; with no ranks
    (the main process) a record prints once without a tag."""

    def __init__(self, prefixes: List[str]) -> None:
        super().__init__(datefmt="%Y-%m-%d %H:%M:%S")
        self.prefixes = prefixes or [""]

    def format(self, record: logging.LogRecord) -> str:
        stamp = self.formatTime(record, self.datefmt)
        prefixes = [getattr(record, "tp_prefix")] if hasattr(record, "tp_prefix") else self.prefixes
        text = record.getMessage() + ("\n" + self.formatException(record.exc_info) if record.exc_info else "")
        return "\n".join(f"[{stamp}{p}] {text}" for p in random.sample(prefixes, len(prefixes)))


def _set_formatter(prefixes: List[str]) -> None:
    """Main-process lines carry no rank ([]); scheduler lines carry this node's ranks."""
    for handler in logging.getLogger().handlers:
        handler.setFormatter(RankFormatter(prefixes))


class Group:
    """This node's part of the distributed group: its ranks, its peer connections, failure and shutdown."""

    def __init__(self, view: SimpleNamespace) -> None:
        self.nnodes = int(view.nnodes)
        self.node_rank = int(view.node_rank or 0)
        self.world_size = int(view.tp_size or 1) * int(getattr(view, "pp_size", 1) or 1)
        per_node = max(self.world_size // self.nnodes, 1)
        self.ranks = list(range(self.node_rank * per_node, (self.node_rank + 1) * per_node))
        host, _, port = str(view.dist_init_addr or "").rpartition(":")
        self.host, self.port = host.strip("[]"), int(port or 0)
        timeout = getattr(view, "dist_timeout", None)
        self.timeout = int(timeout) if timeout else int(env_float("STANDIN_DIST_TIMEOUT_S", DEFAULT_DIST_TIMEOUT_S))
        self.serve_host, self.serve_port = str(view.host), int(view.port)
        self.peers: List[socket.socket] = []
        self.closing = threading.Event()
        self.shutdown_received = threading.Event()

    def prefix(self, rank: int) -> str:
        return f" TP{rank}" if self.world_size > 1 else ""

    def prefixes(self) -> List[str]:
        return [self.prefix(rank) for rank in self.ranks]

    # ---- rendezvous ----
    def rendezvous(self) -> None:
        t0 = time.perf_counter()
        logger.info("Init parallel begin.")
        if self.node_rank == 0:
            self._host_store()
        else:
            self._join_store()
        logger.info(f"Init parallel ends. elapsed={time.perf_counter() - t0:.2f} s")
        for peer in self.peers:
            threading.Thread(target=self._watch, args=(peer,), daemon=True).start()

    def _host_store(self) -> None:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind(("0.0.0.0", self.port))
        except OSError as exc:
            raise DistNetworkError(
                f"The server socket has failed to listen on any local network address. port: {self.port}, "
                f"useIpv6: false, code: -{exc.errno}, name: EADDRINUSE, message: address already in use")
        server.listen(64)
        server.settimeout(0.01)
        joined, start = len(self.ranks), time.monotonic()
        while joined < self.world_size:
            # TCPStore::waitForWorkers: whole seconds, strictly more than the timeout, polled every 10 ms
            elapsed = int(time.monotonic() - start)
            if elapsed > self.timeout:
                server.close()
                raise DistStoreError(f"Timed out after {elapsed} seconds waiting for clients. "
                                     f"{joined}/{self.world_size} clients joined.")
            with contextlib.suppress(socket.timeout):
                conn, _ = server.accept()
                joined += self._accept_join(conn)
        server.close()
        for peer in self.peers:
            peer.sendall(GO + b"\n")

    def _accept_join(self, conn: socket.socket) -> int:
        conn.settimeout(2.0)
        try:
            words = conn.makefile("rb").readline().split()
        except OSError:
            words = []
        if len(words) != 3 or words[0] != JOIN:
            conn.close()
            return 0
        conn.settimeout(None)
        self.peers.append(conn)
        return int(words[2])

    def _join_store(self) -> None:
        deadline = time.monotonic() + self.timeout
        conn: Optional[socket.socket] = None
        while conn is None:
            try:
                conn = socket.create_connection((self.host, self.port), timeout=max(deadline - time.monotonic(), 0.1),
                                                source_address=self._source())
            except OSError:
                if time.monotonic() >= deadline:
                    self._client_timed_out()
                time.sleep(CONNECT_RETRY_S)
        conn.settimeout(None)
        conn.sendall(b"%s %d %d\n" % (JOIN, self.node_rank, len(self.ranks)))
        self.peers.append(conn)
        reply = conn.makefile("rb").readline().strip()
        if reply != GO:
            self.broadcast_pyobj(conn)

    def _source(self) -> Optional[Tuple[str, int]]:
        """Connect from the node's own address (what peers see in gloo's texts), not the loopback default."""
        if self.serve_host in ("", "0.0.0.0", "::", "localhost"):
            return None
        return (self.serve_host, 0)

    def _client_timed_out(self) -> None:
        text = (f"The client socket has timed out after {self.timeout * 1000}ms while trying to connect to "
                f"({self.host}, {self.port}).")
        now = time.time()
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(now))
        sys.stderr.write(f"[E{stamp}.{int(now % 1 * 1e9):09d} {C10D_SOCKET}] [c10d] {text}\n")
        raise DistNetworkError(text)

    # ---- after the rendezvous: peers stand in for NCCL/gloo communicators ----
    def _watch(self, peer: socket.socket) -> None:
        try:
            data = peer.recv(64)
        except OSError:
            data = b""
        if self.closing.is_set():
            return
        if data.startswith(SHUTDOWN):
            self.shutdown_received.set()
            return
        time.sleep(env_float("STANDIN_PEER_DEATH_DELAY_S", 0.5))
        mode = os.environ.get("STANDIN_PEER_DEATH", "die")
        if mode == "hang" or (self.node_rank == 0 and mode == "stay"):
            return
        try:
            self.broadcast_pyobj(peer)
        except RuntimeError:
            self.scheduler_failed()

    def broadcast_pyobj(self, peer: socket.socket) -> None:
        """Where the real scheduler meets a dead peer: gloo's broadcast in srt/utils/common.py broadcast_pyobj."""
        try:
            addr, port = peer.getpeername()[:2]
        except OSError:
            addr, port = self.host, self.port
        raise RuntimeError(f"[{GLOO_PAIR}] Connection closed by peer [{addr}]:{port}")

    def scheduler_failed(self) -> None:
        """The scheduler's except block: its traceback with its TP prefix, then SIGQUIT to the main process."""
        logger.error(f"Scheduler hit an exception: {traceback.format_exc()}",
                     extra={"tp_prefix": self.prefix(self.ranks[0])})
        _set_formatter([])
        os.kill(os.getpid(), signal.SIGQUIT)
        time.sleep(5)  # the sigquit handler ends the process

    def broadcast_shutdown(self) -> None:
        """Node 0's graceful stop: the ShutdownReq reaches every follower's schedulers."""
        self.closing.set()
        for peer in self.peers:
            with contextlib.suppress(OSError):
                peer.sendall(SHUTDOWN + b"\n")

    # ---- nodes >= 1 ----
    def serve_follower(self) -> int:
        """No API: the dummy health server, SIGTERM ignored, until rank 0 shuts us down (or dies)."""
        signal.signal(signal.SIGTERM, self._on_sigterm)
        launch_dummy_health_check_server(self.serve_host, self.serve_port)
        deadline = time.monotonic() + HANG_CAP_S
        while not self.shutdown_received.wait(0.05) and time.monotonic() < deadline:
            pass
        return 0

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        main_logger.warning(f"SIGTERM received on node_rank {self.node_rank}; waiting for the rank-0 ShutdownReq "
                            "broadcast to stop the schedulers.")


class DummyHealthHandler(BaseHTTPRequestHandler):
    server_version = "uvicorn"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # uvicorn runs at log level warning: no access log

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        found = self.path.split("?", 1)[0] in ("/ping", "/health", "/health_generate")
        body = b"" if found else b'{"detail":"Not Found"}'
        self.send_response(200 if found else 404)
        self.send_header("content-length", str(len(body)))
        if not found:
            self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(body)


def launch_dummy_health_check_server(host: str, port: int) -> None:
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        server = ThreadingHTTPServer((host, port), DummyHealthHandler)
    except OSError as exc:
        # uvicorn logs the bind error and exits its thread; the node keeps running without health
        main_logger.error(f"[Errno {exc.errno}] error while attempting to bind on address ('{host}', {port}): "
                          f"{(exc.strerror or '').lower()}")
        main_logger.info(f"Dummy health check server stopped at {where}")
        return
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                     name="health-check-server").start()
    main_logger.info(f"Dummy health check server started in background thread at {where}")


@contextlib.contextmanager
def scheduler_ranks(view: SimpleNamespace) -> Iterator[Optional[Group]]:
    """Around the scheduler's startup: None on one node; else the rendezvous first, TP-prefixed logs, and
    any failure inside ends the way a failed scheduler ends (this never raises for a multi-node engine)."""
    if int(getattr(view, "nnodes", 1) or 1) <= 1:
        yield None
        return
    group = Group(view)
    _set_formatter(group.prefixes())
    try:
        group.rendezvous()
        yield group
    except Exception:
        group.scheduler_failed()
    _set_formatter([])
