"""STAND-IN for tests: an engine core that dies while the HTTP server lives on (stdlib only); never used by the
product.

STANDIN_DEAD_CORE_FILE names a file: while it exists the stand-in's engine core is "dead" (as a real vLLM whose
EngineCore process was stopped, vllm#16259, or a real SGLang whose scheduler is frozen): vLLM's /health still
answers 200 (the SGLang stand-in's answers 503 after its health check's timeout), every completion hangs until the file is
gone (at most an hour), and /metrics stays as it was when the core died (a request that arrives then is never
scheduled, so it is not counted; one already running stays counted).
"""

import os
import time

LIMIT_S = 3600.0


def core_dead() -> bool:
    path = os.environ.get("STANDIN_DEAD_CORE_FILE", "")
    return bool(path) and os.path.exists(path)


def wait_for_core() -> None:
    """Blocks while the core is dead (bounded)."""
    deadline = time.monotonic() + LIMIT_S
    while core_dead() and time.monotonic() < deadline:
        time.sleep(0.1)


def completion(model: str, body: dict, owner: str) -> dict:
    """An OpenAI /v1/completions answer (the shape both real engines return): max_tokens tokens of nonsense."""
    wanted = body.get("max_tokens")
    n = wanted if isinstance(wanted, int) and 0 < wanted <= 16 else 16
    return {"id": "cmpl-standin%d" % int(time.time() * 1000), "object": "text_completion",
            "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": " stand" * n, "logprobs": None, "finish_reason": "length",
                         "stop_reason": None}],
            "usage": {"prompt_tokens": 1, "total_tokens": 1 + n, "completion_tokens": n},
            "system_fingerprint": owner}
