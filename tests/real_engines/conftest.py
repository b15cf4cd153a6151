"""The real-engine tier: deployer deploys REAL vLLM (its CPU build) and REAL SGLang (its CPU engine) serving the
tiny model made by scripts/make-tiny-model.py, over the real sshd test host (a login shell with an rc file).

Venvs and model come from `make real-engines` (scripts/build-real-{vllm,sglang}-venv.sh, cached under
~/.cache/deployer). Without them the tier is skipped saying how to build them, except under CI=true, where a
missing venv fails it. Every launch is capped by its profile (vLLM: VLLM_CPU_KVCACHE_SPACE; SGLang:
--max-total-tokens): uncapped, vLLM takes 0.92 x RAM and SGLang sizes its pool from free RAM. After each test
no engine of this tier may be left running (`no_engine_left`).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sshbed import SSHD, free_port, make_sshd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

CACHE = Path(os.environ.get("DEPLOYER_CACHE", Path.home() / ".cache" / "deployer"))
VLLM_VENV = Path(os.environ.get("REAL_VLLM_VENV", CACHE / "real-vllm-venv"))
SGLANG_VENV = Path(os.environ.get("REAL_SGLANG_VENV", CACHE / "real-sglang-venv"))
MODEL = Path(os.environ.get("TINY_MODEL", CACHE / "tiny-llama"))
HERE = Path(__file__).resolve().parent
STANDIN_BIN = HERE.parent / "standin" / "bin"
# Real vLLM's dtype in this tier: float32 keeps its CPU attention off AMX tiles (vllm_engine says why); the same
# setting as scripts/real-vllm-serves.py's probe.
VLLM_DTYPE = "float32"
# A real CPU engine starts in 15-45 s here; on CI's busy 2 cores allow more, never unbounded.
STARTUP_S = 240.0


def _missing() -> str | None:
    for what, path in (("real vLLM venv", VLLM_VENV / ".stamp"), ("real SGLang venv", SGLANG_VENV / ".stamp"),
                       ("tiny model", MODEL / ".stamp")):
        if not path.exists():
            return f"no {what} at {path.parent} (run `make real-engines`)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.real_engines)
    if os.environ.get("REAL_VLLM_SERVES") == "0":
        _deselect_vllm_serving(config, items)


def _deselect_vllm_serving(config: pytest.Config, items: list[pytest.Item]) -> None:
    """REAL_VLLM_SERVES=0 (.ci/run, after scripts/real-vllm-serves.py saw the real vLLM CPU build die on this
    machine's CPU, with no deployer involved): the tests that need real vLLM to serve are deselected, loudly; the
    real SGLang ones and the rest run."""
    gone = [item for item in items if Path(str(item.fspath)).name.startswith("test_vllm_")]
    if gone:
        config.hook.pytest_deselected(items=gone)
        items[:] = [item for item in items if item not in gone]
        print(f"\nREAL_VLLM_SERVES=0: {len(gone)} real-vLLM serving tests deselected: real vLLM cannot generate "
              "a token on this machine's CPU (scripts/real-vllm-serves.py)", file=sys.stderr)


@pytest.fixture(autouse=True)
def real_engines_present() -> None:
    """Skip saying what to build when the venvs or the model are missing; under CI=true, fail instead."""
    missing = _missing()
    if missing is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(missing)
        pytest.skip(missing)


def engine_pids(under: Path) -> list[int]:
    """Processes of this tier's engines: by the venv path in their command line, or by the titles vLLM and SGLang
    give their processes with setproctitle (which also blanks their environ), whose working directory is under
    `under` (a run dir of this test session: the supervisor starts the engine there)."""
    pids = []
    for pid, argv, cwd in _processes():
        cmd = " ".join(argv)
        ours = str(VLLM_VENV) in cmd or str(SGLANG_VENV) in cmd or cmd.startswith(("VLLM::", "sglang::"))
        if ours and (cwd == under or under in cwd.parents):
            pids.append(pid)
    return pids


def supervisor_pids(under: Path) -> list[int]:
    """deployer's supervisors of this test session's runs: `python3 -B -S <run dir>/supervise.py ...` under `under`.
    A test that failed before its `deploy down` leaves one, and it would restart the engine `no_engine_left` kills
    (the next test's teardown then finds that engine: an ERROR that is not its own)."""
    pids = []
    for pid, argv, _ in _processes():
        script = next((Path(a) for a in argv[1:4] if a.endswith("/supervise.py")), None)
        if script is not None and under in script.parents:
            pids.append(pid)
    return pids


def _processes() -> Iterator[tuple[int, list[str], Path]]:
    """Every process this user can read: pid, argv, working directory."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:
            continue
        yield int(entry.name), argv, cwd


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


_SHORT: dict[Path, Path] = {}


def short_tmp(tmp: Path) -> Path:
    """A short private directory for the engine's Unix sockets (TMPDIR, VLLM_RPC_BASE_PATH), one per test dir:
    a socket path holds at most 107 bytes, and vLLM's `<dir>/<uuid4>` under an xdist worker's tmp_path is longer
    (ZMQError "ipc path ... is longer than 107 characters"; the `ipc-path-too-long` signature). Made by mkdtemp
    (a name nobody could have planted in /tmp), removed after the test by `no_engine_left`, once its engines are
    gone."""
    if tmp not in _SHORT:
        _SHORT[tmp] = Path(tempfile.mkdtemp(prefix="re-"))
    return _SHORT[tmp]


@pytest.fixture(autouse=True)
def no_engine_left(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """After each test: no engine this test session started still runs (a leak is killed and fails the test); a
    supervisor left running is killed first, so it cannot start the engine again."""
    yield
    root = tmp_path_factory.getbasetemp().resolve()
    deadline = time.monotonic() + 15
    while (engine_pids(root) or supervisor_pids(root)) and time.monotonic() < deadline:
        time.sleep(0.5)
    supervisors = supervisor_pids(root)
    _kill(supervisors)
    left = engine_pids(root)
    _kill(left)
    for tmp in list(_SHORT):
        shutil.rmtree(_SHORT.pop(tmp), ignore_errors=True)
    assert not left, f"engine processes left behind: {left} (their supervisors, killed first: {supervisors})"


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHD]:
    """The target: a real sshd on loopback whose login shell runs a ~150 ms rc file. Preflight asks a GPU box's
    nvidia-smi: the stand-in one answers (one idle H200); the engines themselves run on this CPU."""
    bed = make_sshd(tmp_path_factory.mktemp("real-host"), rc_cost=0.15)
    (bed.bin_dir / "nvidia-smi").symlink_to(STANDIN_BIN / "nvidia-smi")
    try:
        yield bed
    finally:
        bed.stop()


def vllm_engine(port: int, tmp: Path, **args: Any) -> dict[str, Any]:
    """The `engine:` section for real vLLM on this CPU: capped KV cache, its files kept out of shared places, and
    float32 (VLLM_DTYPE): in bfloat16 on a CPU with AMX tiles, vLLM 0.32.0's CPU attention runs AMX instructions
    without asking Linux for them (arch_prctl ARCH_REQ_XCOMP_PERM), and its worker dies with SIGILL at the first
    token unless something else in that process asked first, which --enforce-eager with the tiny model did not
    in 7 launches of 8 (seen on an AMX VM, 2026-12-05; scripts/real-vllm-serves.py says more)."""
    return {
        "kind": "vllm", "python": str(VLLM_VENV / "bin" / "python"), "model_path": str(MODEL), "port": port,
        "args": {"enforce_eager": True, "max_model_len": 512, "dtype": VLLM_DTYPE, **args},
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"),
                "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"), "TMPDIR": str(short_tmp(tmp)),
                "VLLM_RPC_BASE_PATH": str(short_tmp(tmp)),
                # its processes meet at the address of the default route unless told: the netns fault tests
                # of this machine add and remove such routes (seen: 192.0.2.2, gone a minute later)
                "VLLM_HOST_IP": "127.0.0.1"},
    }


def sglang_engine(port: int, tmp: Path, **args: Any) -> dict[str, Any]:
    """The `engine:` section for real SGLang's CPU engine, its KV pool capped."""
    return {
        "kind": "sglang", "python": str(SGLANG_VENV / "bin" / "python"), "model_path": str(MODEL), "port": port,
        "args": {"device": "cpu", "max_total_tokens": 8192, **args},
        "env": {"SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1", "TMPDIR": str(short_tmp(tmp))},
    }


def write_real_profile(tmp: Path, host: SSHD, name: str, engine: dict[str, Any], **extra: Any) -> Path:
    (tmp / "tmp").mkdir(exist_ok=True)
    data: dict[str, Any] = {
        "name": name, "target": host.target(tmp / "work"), "engine": engine,
        "health": {"interval_s": 0.5, "startup_timeout_s": STARTUP_S, "stall_timeout_s": 120},
        "retry": {"max_attempts": 3, "backoff_s": 0.5},
        "restart": {"grace_s": 15},
    }
    for key, value in extra.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) and isinstance(data.get(key), dict) else value
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


__all__ = ["free_port", "sglang_engine", "vllm_engine", "write_real_profile", "engine_pids", "MODEL"]
