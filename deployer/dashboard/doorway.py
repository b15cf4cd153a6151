"""The dashboard's connections: how many may be open, how long one may idle, and the threads that answer them.

A connection is accepted into the `Doorway`, one thread with a selector, where it waits until its request's head
(request line and headers) has arrived, at most `idle_timeout_s` after it opened; then the head is handed to one of
a fixed number of `Workers`, which answer it. An idle or dripping connection costs a file descriptor and a few
bytes, never a thread, so a normal request is answered at once however many idle connections are open. At most
`max_connections` are open at a time (waiting and being answered together): a new one beyond that closes the
oldest one still waiting; when none is waiting (every one is being answered) the new one is refused (503).
"""

from __future__ import annotations

import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_HEAD_BYTES = 32 << 10          # request line and headers; a GET of this dashboard needs well under 2 KiB
HEAD_ENDS = (b"\r\n\r\n", b"\n\n")

Answer = Callable[[socket.socket, "tuple[str, int]", bytes], None]
Refuse = Callable[[socket.socket, int, str], None]


@dataclass
class _Waiting:
    sock: socket.socket
    address: tuple[str, int]
    deadline: float
    head: bytearray = field(default_factory=bytearray)


class Workers:
    """`count` daemon threads answering what `submit` hands them, in order (a daemon: a stuck answer never holds
    up the process's exit)."""

    def __init__(self, count: int, name: str) -> None:
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(count)]
        for thread in self._threads:
            thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def stop(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()


class Doorway:
    """Connections waiting for their request's head; see the module docstring."""

    def __init__(self, answer: Answer, refuse: Refuse, *, workers: int, max_connections: int,
                 idle_timeout_s: float) -> None:
        self._answer = answer
        self._refuse = refuse
        self._max = max_connections
        self._idle_s = idle_timeout_s
        self._workers = Workers(workers, "dashboard-worker")
        self._arrivals: queue.Queue[tuple[socket.socket, tuple[str, int]]] = queue.Queue()
        self._waiting: dict[socket.socket, _Waiting] = {}      # oldest first (insertion order)
        self._open = 0                                          # waiting + being answered
        self._open_lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dashboard-doorway", daemon=True)
        self._thread.start()

    @property
    def open_connections(self) -> int:
        with self._open_lock:
            return self._open

    def admit(self, sock: socket.socket, address: tuple[str, int]) -> None:
        """A connection just accepted (called from the accepting thread)."""
        with self._open_lock:
            self._open += 1
        self._arrivals.put((sock, address))
        self._wake()

    def stop(self) -> None:
        self._stopping.set()
        self._wake()
        self._thread.join(timeout=5)
        self._workers.stop()

    # --- the doorway's thread ---------------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while not self._stopping.is_set():
                self._take_arrivals()
                timeout = self._expire(time.monotonic())
                for key, _ in self._selector.select(timeout):
                    if key.fileobj is self._wake_r:
                        self._drain_wake()
                    else:
                        self._read(self._waiting[key.fileobj])  # type: ignore[index]
        finally:
            for waiting in list(self._waiting.values()):
                self._drop(waiting)
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()

    def _take_arrivals(self) -> None:
        while True:
            try:
                sock, address = self._arrivals.get_nowait()
            except queue.Empty:
                return
            while self.open_connections > self._max and self._waiting:
                self._drop(next(iter(self._waiting.values())))   # the oldest still waiting makes room
            if self.open_connections > self._max:
                self._refuse(sock, 503, "too many connections")
                self._closed(sock)
                continue
            sock.setblocking(False)
            waiting = _Waiting(sock, address, time.monotonic() + self._idle_s)
            self._waiting[sock] = waiting
            self._selector.register(sock, selectors.EVENT_READ)

    def _expire(self, now: float) -> float:
        """Close the connections past their deadline; how long until the next one's."""
        for waiting in [w for w in self._waiting.values() if w.deadline <= now]:
            self._drop(waiting)
        return max(0.0, min((w.deadline for w in self._waiting.values()), default=now + 1.0) - now)

    def _read(self, waiting: _Waiting) -> None:
        try:
            data = waiting.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(waiting)
            return
        waiting.head += data
        if any(end in waiting.head for end in HEAD_ENDS):
            self._hand_on(waiting)
        elif len(waiting.head) > MAX_HEAD_BYTES:
            self._forget(waiting)
            self._refuse(waiting.sock, 431, f"the request's head is over {MAX_HEAD_BYTES} bytes")
            self._closed(waiting.sock)

    def _hand_on(self, waiting: _Waiting) -> None:
        self._forget(waiting)
        sock, address, head = waiting.sock, waiting.address, bytes(waiting.head)

        def job() -> None:
            try:
                self._answer(sock, address, head)
            finally:
                self._closed(sock)

        self._workers.submit(job)

    def _forget(self, waiting: _Waiting) -> None:
        del self._waiting[waiting.sock]
        self._selector.unregister(waiting.sock)

    def _drop(self, waiting: _Waiting) -> None:
        self._forget(waiting)
        self._closed(waiting.sock)

    def _closed(self, sock: socket.socket) -> None:
        try:
            sock.close()
        finally:
            with self._open_lock:
                self._open -= 1

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError, OSError):
            pass


__all__ = ["Doorway", "MAX_HEAD_BYTES", "Workers"]
