"""STAND-IN for tests: imitates vLLM 0.33.0 (no GPU here); never used by the product.

The HTTP side (stdlib ThreadingHTTPServer in place of uvicorn/FastAPI): /health (200 once the engine is up,
empty body), /metrics (vLLM 0.32.0's real capture, advanced per completion: standin_metrics), /v1/models, /v1/chat/completions, /v1/completions, /version, /ping, vLLM's error bodies, the --api-key check of
the /v1 routes, and uvicorn-style access lines on stdout.
"""

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Optional, Tuple

import standin_core
import standin_metrics

PHRASES = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 503: "Service Unavailable"}


class EngineState:
    def __init__(self, model: str) -> None:
        self.model = model
        self.phase = "starting"
        self.api_key: Optional[str] = None
        self.access_log = True
        self.lock = threading.Lock()
        self.metrics = standin_metrics.vllm()

    def set_phase(self, phase: str) -> None:
        with self.lock:
            self.phase = phase

    def get_phase(self) -> str:
        with self.lock:
            return self.phase


def error_body(message: str, kind: str, code: int, param: Optional[str] = None) -> Dict[str, Any]:
    """entrypoints/openai/engine/protocol.py ErrorResponse (0.33.0)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class Handler(BaseHTTPRequestHandler):
    server_version = "uvicorn"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    @property
    def state(self) -> EngineState:
        return self.server.engine_state  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        if self.state.access_log:
            host, port = self.client_address[:2]
            sys.stdout.write(f'INFO:     {host}:{port} - "{self.command} {self.path} HTTP/1.1" '
                             f"{code} {PHRASES.get(code, '')}\n")
            sys.stdout.flush()

    def _authorized(self) -> bool:
        """--api-key guards /v1 routes only (entrypoints/launchers/middleware: AuthenticationMiddleware)."""
        key = self.state.api_key
        if key is None or not self.path.startswith("/v1"):
            return True
        if self.headers.get("authorization", "") == f"Bearer {key}":
            return True
        self._send(401, {"error": "Unauthorized"})
        return False

    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        phase = self.state.get_phase()
        if path == "/health":
            self._send(200, b"") if phase == "ready" else self._send(503, b"")
        elif path == "/ping":
            self._send(200, b"") if phase == "ready" else self._send(503, b"")
        elif path == "/metrics":
            self._send(200, self.state.metrics.text().encode(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/version":
            from vllm import __version__

            self._send(200, {"version": __version__})
        elif path == "/v1/models":
            if self._authorized():
                self._send(200, {"object": "list", "data": [{
                    "id": self.state.model, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                    "root": self.state.model, "parent": None, "max_model_len": None, "permission": []}]})
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        if path not in ("/v1/chat/completions", "/v1/completions"):
            self._send(404, {"detail": "Not Found"})
            return
        if not self._authorized():
            return
        if self.state.get_phase() != "ready":
            self._send(503, error_body("The server is shutting down.", "ServiceUnavailableError", 503))
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._send(400, error_body("JSON decode error", "BadRequestError", 400))
            return
        model = body.get("model")
        if model not in (None, self.state.model):
            self._send(404, error_body(f"The model `{model}` does not exist.", "NotFoundError", 404, "model"))
            return
        if path == "/v1/completions":  # the one-token probe's (not added to the replayed /metrics)
            standin_core.wait_for_core()
            self._send(200, standin_core.completion(self.state.model, body, "vllm"))
            return
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            self._send(400, error_body("[{'type': 'missing', 'loc': ('body', 'messages'), 'msg': 'Field required'}]",
                                       "BadRequestError", 400))
            return
        standin_core.wait_for_core()  # arrived while the core is dead: never scheduled, not counted
        self.state.metrics.started()
        try:
            answer = chat_completion(self.state.model)
            standin_core.wait_for_core()
        finally:
            self.state.metrics.finished()
        self._send(200, answer)


def chat_completion(model: str) -> Dict[str, Any]:
    text = os.environ.get("STANDIN_CHAT_TEXT", "Hello! This is the stand-in vLLM answering.")
    return {
        "id": f"chatcmpl-standin{int(time.time() * 1000)}", "object": "chat.completion",
        "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None,
                                             "annotations": None, "audio": None, "function_call": None,
                                             "tool_calls": [], "reasoning_content": None},
                     "logprobs": None, "finish_reason": "stop", "stop_reason": None}],
        "service_tier": None, "system_fingerprint": None,
        "usage": {"prompt_tokens": 12, "total_tokens": 22, "completion_tokens": 10, "prompt_tokens_details": None},
        "prompt_logprobs": None, "kv_transfer_params": None,
    }


def bind(host: str, port: int, state: EngineState) -> Tuple[Optional[ThreadingHTTPServer], Optional[OSError]]:
    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:
        return None, exc
    server.daemon_threads = True
    server.engine_state = state  # type: ignore[attr-defined]
    return server, None
