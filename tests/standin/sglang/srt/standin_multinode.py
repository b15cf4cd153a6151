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
- STAND-IN behaviour, the per-step collective: rank 0's scheduler loop (a thread named "scheduler") exchanges one
  message with every follower on each iteration, idle or not, and waits for each answer in a blocking socket read
  before the iteration ends, as SGLang 0.5.23's scheduler does: every iteration of event_loop_normal
  (srt/managers/scheduler.py:2026) starts with ingest_requests (:2184) -> request_receiver.recv_requests, whose
  _broadcast_reqs_across_ranks calls broadcast_pyobj over tp_group.cpu_group (gloo), idle or not, which every tp
  rank must join (srt/managers/scheduler_components/request_receiver.py:206), and each batch's forward is a
  tensor-parallel collective of all ranks (NCCL all-reduce). vLLM's multi-node engine is not modelled here.
  While generations wait for steps, each iteration is one step: it advances the step count they wait on and the per-step token counter of /metrics
  (sglang:realtime_tokens_total mode="decode", by the number of generations waiting: engines/sglang/metrics.yaml
  `progress`). Every generation on rank 0 (chat and plain completions, /generate, the warmup) needs its steps
  (a chat completion 10, one per token it reports). So a follower that stops answering (SIGSTOP, a wedged
  process) stops rank 0's steps: its requests stay running, its counter stays still, its scheduler thread waits
  in the socket read (bounded by the dist timeout, as gloo's is; then it fails as after a peer death).

Env knobs: STANDIN_DIST_TIMEOUT_S (600), STANDIN_PEER_DEATH_DELAY_S (0.5), STANDIN_PEER_DEATH (die|stay|hang),
STANDIN_MULTINODE_STEP_S (0.02: one busy step; an idle iteration waits 0.05 s).
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
from typing import Any, Callable, Iterator, List, Optional, Tuple

logger = logging.getLogger("sglang.srt.managers.scheduler")
main_logger = logging.getLogger("sglang.srt.entrypoints.engine")

# torch's default process-group timeout for the NCCL backend (torch.distributed.constants.default_pg_nccl_timeout)
DEFAULT_DIST_TIMEOUT_S = 600
CONNECT_RETRY_S = 0.1
HANG_CAP_S = 3600.0
JOIN, GO, SHUTDOWN, STEP, DONE = b"JOIN", b"GO", b"SHUTDOWN", b"STEP", b"DONE"
IDLE_S = 0.05   # an idle scheduler iteration
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
        self.names: dict = {}                  # a peer's address as seen when it joined (a reset one has none)
        self.readers: dict = {}                # a peer's reader, when one was made at the rendezvous (kept: it may
                                               # hold what came after GO already)
        self.closing = threading.Event()
        self.shutdown_received = threading.Event()
        self.send_lock = threading.Lock()      # the loop's STEP and a shutdown's broadcast share the sockets
        self.cond = threading.Condition()
        self.steps = 0                         # rank 0: steps made (what generations wait on)
        self.wanted = 0                        # rank 0: generations waiting for steps now
        self.on_step: Optional[Callable[[int], None]] = None   # rank 0: a step's tokens to /metrics

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
        if self.node_rank == 0:
            threading.Thread(target=self.event_loop, daemon=True, name="scheduler").start()
        for peer in self.peers if self.node_rank > 0 else []:
            threading.Thread(target=self._follow, args=(peer,), daemon=True, name="scheduler").start()

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
        self.names[conn] = conn.getpeername()[:2]
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
        self.readers[conn] = conn.makefile("rb")
        reply = self.readers[conn].readline().strip()
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
    def event_loop(self) -> None:
        """Rank 0's scheduler: each iteration one exchange with every follower (the per-step collective); a step
        while generations wait for one. Ends with the group (a shutdown, a failed peer) or at HANG_CAP_S."""
        peers = [(peer, peer.makefile("rb")) for peer in self.peers]
        deadline, n = time.monotonic() + HANG_CAP_S, 0
        while peers and not self.closing.is_set() and time.monotonic() < deadline:
            with self.cond:
                busy = self.wanted
            n += 1
            for peer, reader in list(peers):
                if not self._exchange(peer, reader, n):
                    peers.remove((peer, reader))   # STANDIN_PEER_DEATH=stay: rank 0 goes on without it
            if self.closing.is_set():
                return
            if busy:
                with self.cond:
                    self.steps += 1
                    self.cond.notify_all()
                if self.on_step is not None:
                    self.on_step(busy)
            time.sleep(env_float("STANDIN_MULTINODE_STEP_S", 0.02) if busy else IDLE_S)

    def _exchange(self, peer: socket.socket, reader: Any, n: int) -> bool:
        """One collective with one follower: STEP n out, its DONE n back (a blocking read: a frozen follower
        keeps rank 0 here). False when the peer is gone and rank 0 goes on without it."""
        try:
            peer.settimeout(self.timeout)
            with self.send_lock:
                peer.sendall(b"%s %d\n" % (STEP, n))
            line = reader.readline()
        except OSError:
            line = b""
        if line.startswith(DONE):
            return True
        if self.closing.is_set():
            return False
        return self._peer_gone(peer, line)

    def _follow(self, peer: socket.socket) -> None:
        """A follower's scheduler: answers each of rank 0's steps; a shutdown or a lost rank 0 ends it."""
        reader = self.readers.get(peer) or peer.makefile("rb")
        for _ in range(1 << 62):
            try:
                line = reader.readline()
            except OSError:
                line = b""
            if not line.startswith(STEP):
                break
            try:
                with self.send_lock:
                    peer.sendall(DONE + line[len(STEP):])
            except OSError:
                line = b""
                break
        if self.closing.is_set():
            return
        if line.startswith(SHUTDOWN):
            self.shutdown_received.set()
            return
        self._peer_gone(peer, line)

    def _peer_gone(self, peer: socket.socket, data: bytes) -> bool:
        """What this rank does once a peer is gone: fail in its scheduler (die), or wait for ever in the
        collective (hang), or (rank 0, stay) go on without it (then False)."""
        time.sleep(env_float("STANDIN_PEER_DEATH_DELAY_S", 0.5))
        mode = os.environ.get("STANDIN_PEER_DEATH", "die")
        if mode == "hang":
            self.closing.wait(HANG_CAP_S)   # a collective that never returns
            return False
        if self.node_rank == 0 and mode == "stay":
            return False
        try:
            self.broadcast_pyobj(peer)
        except RuntimeError:
            self.scheduler_failed()
        return False

    def wait_steps(self, n: int, limit: float = HANG_CAP_S) -> bool:
        """A generation on rank 0: blocks until the scheduler made `n` more steps (bounded); True when it did."""
        with self.cond:
            self.wanted += 1
            target = self.steps + n
            try:
                return self.cond.wait_for(lambda: self.steps >= target, timeout=limit)
            finally:
                self.wanted -= 1

    def broadcast_pyobj(self, peer: socket.socket) -> None:
        """Where the real scheduler meets a dead peer: gloo's broadcast in srt/utils/common.py broadcast_pyobj."""
        try:
            addr, port = self.names.get(peer) or peer.getpeername()[:2]
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
            with contextlib.suppress(OSError), self.send_lock:
                peer.settimeout(1.0)   # a frozen follower's full buffer must not hold the shutdown
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
