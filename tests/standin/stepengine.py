"""STAND-IN for tests and bench/hang.py: an engine whose scheduler steps in its own process (stdlib only); never
used by the product.

`python3 stepengine.py PORT`. Like a real engine's split (vLLM's API server and EngineCore, SGLang's tokenizer
manager and scheduler), the HTTP server is the main process and the steps run in a forked child, the "core": while
requests are running it advances a step counter every STEPENGINE_STEP_S seconds; a completion of max_tokens N is
answered once N steps ran after it got one of STEPENGINE_SLOTS running slots (waiting until then). /metrics says
it with vLLM's names (the series the hang rule reads: vllm:num_requests_running, vllm:num_requests_waiting,
vllm:iteration_tokens_total_count). SIGSTOP of the core freezes the steps as a hung engine core would; so does the
file STEPENGINE_FREEZE_FILE while it exists (the core then waits on a threading.Event: a lock wait in its stacks).
SIGTERM: new requests get 503, those in flight finish, then exit 0 (as SGLang's SIGTERM drain does, with no limit
of its own; vLLM's with --shutdown-timeout).
"""

import json
import mmap
import os
import signal
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

READY = "The server is fired up and ready to roll!"
STEP_S = float(os.environ.get("STEPENGINE_STEP_S", "0.02"))
SLOTS = int(os.environ.get("STEPENGINE_SLOTS", "4"))
FREEZE = os.environ.get("STEPENGINE_FREEZE_FILE", "")
LIMIT_S = 600.0

# shared with the core: [steps, running]
SHARED = mmap.mmap(-1, 16)


def _get(i: int) -> int:
    return int(struct.unpack_from("q", SHARED, 8 * i)[0])


def _set(i: int, value: int) -> None:
    struct.pack_into("q", SHARED, 8 * i, value)


def core(parent: int) -> None:
    """The child: one step every STEP_S while requests run; frozen while the freeze file exists."""
    stuck = threading.Event()
    while os.getppid() == parent:
        if _get(1) > 0:
            if FREEZE and os.path.exists(FREEZE):
                stuck.wait(0.5)   # the hung core: waits on an event nobody sets
                continue
            time.sleep(STEP_S)
            _set(0, _get(0) + 1)
        else:
            time.sleep(0.005)
    os._exit(0)


class Engine:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.slots = threading.Semaphore(SLOTS)
        self.running = self.waiting = self.in_flight = 0
        self.draining = False

    def complete(self, tokens: int) -> bool:
        with self.lock:
            self.waiting += 1
            self.in_flight += 1
        got = self.slots.acquire(timeout=LIMIT_S)
        with self.lock:
            self.waiting -= 1
            if got:
                self.running += 1
                _set(1, self.running)
        try:
            if not got:
                return False
            target = _get(0) + tokens
            deadline = time.monotonic() + LIMIT_S
            while _get(0) < target and time.monotonic() < deadline:
                time.sleep(0.005)
            return _get(0) >= target
        finally:
            with self.lock:
                if got:
                    self.running -= 1
                    _set(1, self.running)
                    self.slots.release()
                self.in_flight -= 1

    def metrics(self) -> str:
        with self.lock:
            running, waiting = self.running, self.waiting
        labels = '{engine="0",model_name="standin"}'
        return ("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running%s %d.0\n"
                "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting%s %d.0\n"
                "# TYPE vllm:iteration_tokens_total histogram\nvllm:iteration_tokens_total_count%s %d.0\n"
                % (labels, running, labels, waiting, labels, _get(0)))


ENGINE = Engine()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/health":
            self._send(503 if ENGINE.draining else 200, b"")
        elif self.path == "/metrics":
            self._send(200, ENGINE.metrics().encode(), "text/plain")
        else:
            self._send(404, b"{}")

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        if ENGINE.draining:
            self._send(503, b'{"error": "shutting down"}')
            return
        tokens = int(body.get("max_tokens") or 16)
        if not ENGINE.complete(tokens):
            self._send(500, b'{"error": "no step"}')
            return
        answer = {"object": "text_completion", "choices": [{"index": 0, "text": " x" * tokens}],
                  "usage": {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": tokens + 1}}
        self._send(200, json.dumps(answer).encode())


def drain(server: ThreadingHTTPServer) -> None:
    deadline = time.monotonic() + LIMIT_S
    while ENGINE.in_flight > 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    print("drained: exiting", flush=True)
    server.shutdown()


def main() -> int:
    port = int(sys.argv[1])
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        core(parent)
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True

    def on_term(signum: int, frame: object) -> None:
        ENGINE.draining = True
        print("SIGTERM: draining %d requests in flight" % ENGINE.in_flight, flush=True)
        threading.Thread(target=drain, args=(server,), daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    print("core pid %d" % child, flush=True)
    print(READY, flush=True)
    server.serve_forever(poll_interval=0.05)
    os.kill(child, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
