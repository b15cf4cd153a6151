"""STAND-IN for tests: imitates SGLang 0.5.23 (no GPU here); never used by the product.

The HTTP side of the stand-in (stdlib ThreadingHTTPServer in place of uvicorn/FastAPI): the endpoints a
deployer looks at, their 503/200 behaviour by phase, /metrics with --enable-metrics (SGLang 0.5.23's real capture,
advanced per completion: standin_metrics), and uvicorn-style access log lines on stdout.
"""

from __future__ import annotations

import hmac
import json
import sys
import threading
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, Optional, Tuple

import standin_core
import standin_metrics

STATUS_PHRASES = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 500: "Internal Server Error",
                  503: "Service Unavailable"}
OPEN_PREFIXES = ("/health", "/ready", "/metrics")  # utils/auth.py decide_request_auth (0.5.23): never need a key


def stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


class EngineState:
    """Phase shared by the startup thread and the request handlers: warmup -> ready -> draining."""

    def __init__(self, model: str, server_info: Dict[str, Any]) -> None:
        self.model = model
        self.server_info = server_info
        self.phase = "warmup"
        self.ready_at = 0.0
        self.access_log = True
        self.lock = threading.Lock()
        self.requests = 0
        self.metrics = standin_metrics.sglang()
        self.steps: Optional[Callable[[int], bool]] = None   # rank 0 of a multi-node group: wait for N steps

    def generate(self, tokens: int) -> None:
        """A generation of `tokens` tokens takes that many engine steps where the engine steps as a group (the
        multi-node stand-in's rank 0); elsewhere it is immediate."""
        if self.steps is not None:
            self.steps(max(int(tokens), 1))

    def set_phase(self, phase: str) -> None:
        with self.lock:
            self.phase = phase
            if phase == "ready":
                self.ready_at = time.monotonic()

    def health_ok(self) -> bool:
        """/health runs a one-token generation in SGLang; STANDIN_HEALTH_SLOW_S makes it fail for a while. While the
        core is dead (standin_core) nothing answers that generation: as SGLang 0.5.23's `health_generate`, it waits
        SGLANG_HEALTH_CHECK_TIMEOUT s (default 20), logs why, and answers 503 (a dead core: /health fails here, unlike
        vLLM's, which answers 200)."""
        if standin_core.core_dead():
            timeout = int(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20") or 20)
            tic = time.time()
            deadline = time.monotonic() + timeout
            while standin_core.core_dead() and time.monotonic() < deadline:
                time.sleep(0.1)
            if standin_core.core_dead():
                print(f"[{stamp()}] Health check failed. Server couldn't get a response from detokenizer for last "
                      f"{timeout} seconds. tic start time: {time.strftime('%H:%M:%S', time.localtime(tic))}. "
                      f"last_heartbeat time: {time.strftime('%H:%M:%S', time.localtime(tic))}", flush=True)
                return False
        slow = float(os.environ.get("STANDIN_HEALTH_SLOW_S", "0") or 0)
        with self.lock:
            return self.phase == "ready" and time.monotonic() - self.ready_at >= slow

    def fails_now(self) -> bool:
        """Whether this chat completion is one STANDIN_FAIL_EVERY makes fail (every Nth of this process)."""
        every = standin_metrics.fail_every()
        with self.lock:
            self.requests += 1
            return every > 0 and self.requests % every == 0

    def get_phase(self) -> str:
        with self.lock:
            return self.phase


class Handler(BaseHTTPRequestHandler):
    server_version = "uvicorn"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    @property
    def state(self) -> EngineState:
        return self.server.engine_state  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        if not self.state.access_log:
            return
        host, port = self.client_address[:2]
        sys.stdout.write(
            f'[{stamp()}] INFO:     {host}:{port} - "{self.command} {self.path} HTTP/1.1" '
            f"{code} {STATUS_PHRASES.get(code, '')}\n"
        )
        sys.stdout.flush()

    def _body(self) -> Dict[str, Any]:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            return {}

    def _refused(self, path: str) -> bool:
        """SGLang's --api-key: every route but health, readiness and metrics needs `Authorization: Bearer KEY`
        (401 otherwise), as utils/auth.py's middleware decides."""
        key = self.state.server_info.get("api_key")
        if not key or path.startswith(OPEN_PREFIXES):
            return False
        scheme, _, given = str(self.headers.get("authorization") or "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), str(key).encode()):
            return False
        self._send(401, {"error": "Unauthorized"})
        return True

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        path = self.path.split("?", 1)[0]
        phase = self.state.get_phase()
        if self._refused(path):
            return
        if path in ("/health", "/health_generate"):
            self._send(200, b"") if self.state.health_ok() else self._send(503, b"")
        elif path == "/ready":
            self._send(200, b"") if phase == "ready" else self._send(503, b"")
        elif path == "/model_info":
            self._send(200, {"model_path": self.state.model, "tokenizer_path": self.state.model,
                             "is_generation": True, "model_type": None, "architectures": None})
        elif path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": self.state.model, "object": "model",
                                                         "created": int(time.time()), "owned_by": "sglang",
                                                         "root": self.state.model}]})
        elif path in ("/server_info", "/get_server_info"):
            self._send(200, self.state.server_info)
        elif path == "/metrics" and self.state.server_info.get("enable_metrics"):  # only with --enable-metrics
            self._send(200, self.state.metrics.text().encode(), "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        path = self.path.split("?", 1)[0]
        body = self._body()
        if self._refused(path):
            return
        if self.state.get_phase() == "draining":
            self._send(503, {"error": {"message": "The server is shutting down."}})
        elif path == "/v1/chat/completions":
            status = int(os.environ.get("STANDIN_CHAT_STATUS", "200"))
            if status != 200:
                self._send(status, {"object": "error", "message": "stand-in: STANDIN_CHAT_STATUS", "code": status})
            elif self.state.fails_now():
                self.state.metrics.failed()
                self._send(500, {"object": "error", "message": "stand-in: STANDIN_FAIL_EVERY", "code": 500})
            else:
                standin_core.wait_for_core()  # arrived while the core is dead: never scheduled, not counted
                self.state.metrics.started()
                try:  # generation time (STANDIN_SLOWER_X times it: a slower release): in flight
                    time.sleep(float(os.environ.get("STANDIN_CHAT_DELAY_S", "0")) * standin_metrics.slower())
                    standin_core.wait_for_core()  # the core died while it ran: it stays running
                    self.state.generate(standin_metrics.GENERATED_TOKENS)
                finally:
                    self.state.metrics.finished()
                self._send(200, chat_completion(self.state.model, body))
        elif path == "/v1/completions":  # the one-token probe's (not added to the replayed /metrics)
            standin_core.wait_for_core()
            wanted = body.get("max_tokens")
            self.state.generate(wanted if isinstance(wanted, int) and 0 < wanted <= 16 else 16)
            self._send(200, standin_core.completion(body.get("model") or self.state.model, body, "sglang"))
        elif path == "/generate":
            standin_core.wait_for_core()
            self.state.generate(min(int((body.get("sampling_params") or {}).get("max_new_tokens") or 8), 8))
            self._send(200, generate(body))
        else:
            self._send(404, {"detail": "Not Found"})


def chat_completion(model: str, body: Dict[str, Any]) -> Dict[str, Any]:
    text = os.environ.get("STANDIN_CHAT_TEXT", "Hello! This is the stand-in SGLang answering.")
    return {
        "id": f"chatcmpl-standin{int(time.time() * 1000)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model") or model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text,
                                             "reasoning_content": None, "tool_calls": None},
                     "logprobs": None, "finish_reason": "stop", "matched_stop": 151645}],
        "usage": {"prompt_tokens": 12, "total_tokens": 22, "completion_tokens": 10,
                  "prompt_tokens_details": None},
    }


def generate(body: Dict[str, Any]) -> Dict[str, Any]:
    max_new = int((body.get("sampling_params") or {}).get("max_new_tokens") or 8)
    return {"text": " stand-in" * max(1, min(max_new, 8)),
            "meta_info": {"id": "standin", "finish_reason": {"type": "length", "length": max_new},
                          "prompt_tokens": 4, "completion_tokens": max_new, "cached_tokens": 0}}


def bind(host: str, port: int, state: EngineState) -> Tuple[Optional[ThreadingHTTPServer], Optional[OSError]]:
    """Binds like uvicorn (SO_REUSEADDR); returns the server or the OSError."""
    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:
        return None, exc
    server.daemon_threads = True
    server.engine_state = state  # type: ignore[attr-defined]
    return server, None
