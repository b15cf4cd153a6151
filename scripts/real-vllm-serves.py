"""Can the real vLLM CPU build generate a token on this machine? `PYTHON scripts/real-vllm-serves.py MODEL`.

Exit 0 when it answers a one-token completion; 1 with one line saying why not. It asks the way the real tier
launches vLLM (tests/real_engines/conftest.py vllm_engine): --enforce-eager and --dtype float32. In bfloat16, on a
CPU with AMX tiles, vLLM 0.32.0's CPU attention (csrc/cpu/cpu_attn_amx.hpp, chosen when torch sees AMX, the dtype
is bfloat16 and the block size a multiple of 32) runs `tilezero` without asking Linux for the AMX tile state
(arch_prctl ARCH_REQ_XCOMP_PERM): its worker dies with SIGILL (exit code -4) at the first token unless
something else in that process asked first, which --enforce-eager with the tiny model did not in 7 launches of 8
(seen 2026-12-05 on an AMX VM, whatever launched vLLM; the same launch with the permission asked, or in float32,
serves). `.ci/run` asks this first and, when it cannot, runs the real tier without the tests that need vLLM to serve
(REAL_VLLM_SERVES=0, said loudly), instead of failing on the machine rather than on deployer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

PORT = 18779
DTYPE = "float32"   # the real tier's (tests/real_engines/conftest.py VLLM_DTYPE): see above


def main() -> int:
    model = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": tmp}
        log = open(os.path.join(tmp, "log"), "wb")
        proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                                 "--host", "127.0.0.1", "--port", str(PORT), "--enforce-eager", "--max-model-len",
                                 "512", "--dtype", DTYPE], stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            return _ask(model, proc, os.path.join(tmp, "log"))
        finally:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=30)


def _ask(model: str, proc: subprocess.Popen[bytes], log: str) -> int:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2)
            break
        except OSError:
            time.sleep(2)
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 1}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{PORT}/v1/completions", body,
                                     {"Content-Type": "application/json"})
    try:
        answer = json.loads(urllib.request.urlopen(request, timeout=120).read())
        if answer.get("usage", {}).get("completion_tokens", 0) >= 1:
            return 0
    except (OSError, ValueError):
        pass
    died = [line for line in open(log, errors="replace") if "died unexpectedly" in line]
    print("real vLLM cannot serve on this machine: " + (died[0].strip()[-160:] if died else "no token"))
    return 1


if __name__ == "__main__":
    sys.exit(main())
