"""The stacks of a hung engine, taken before it is restarted: every process of its group, kept in the run dir.

Owns `dump_stacks(pgid, path, env)`: for each process of the group, py-spy's dump of its Python threads when a
py-spy is found (beside the process's interpreter, i.e. installed with the engine environment; on the engine
environment's PATH; on the supervisor's PATH), else what the kernel tells of each thread (/proc/PID/task/TID:
state, wait channel, kernel stack where readable). The whole text goes to `path` (a file of the run dir: the
run's record); the returned summary names the file, the method and each process's top frames (what status,
history and diagnose show; deployer classifies the hang from them with engines/common/hangs.yaml).

Bounded: at most MAX_PROCESSES processes, PY_SPY_TIMEOUT_S per process, DUMP_BUDGET_S in all. Stdlib only,
Python >= 3.8.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Any, Dict, List, Optional

from .base import group_pids

MAX_PROCESSES = 32
PY_SPY_TIMEOUT_S = 5.0    # one py-spy dump takes ~0.3 s (measured on a real CPU engine: 0.26 s for all)
DUMP_BUDGET_S = 12.0      # the daemon's loop waits meanwhile: well inside HEARTBEAT_STALE (20 s), or status would
                          # call the supervisor frozen
TOP_LINES = 12            # a process's top frames kept in the summary
TEXT_MAX = 1 << 20        # per process, in the file


def _read(path: str, limit: int = 1 << 16) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return ""


def _argv0(pid: int) -> str:
    return _read("/proc/%d/cmdline" % pid).split("\0", 1)[0]


def find_py_spy(pid: int, env: Dict[str, str]) -> Optional[str]:
    """py-spy beside the process's interpreter (the engine's environment), else on its PATH or ours."""
    first = _argv0(pid)
    if os.path.isabs(first):
        beside = os.path.join(os.path.dirname(first), "py-spy")
        if os.path.isfile(beside) and os.access(beside, os.X_OK):
            return beside
    for path in (env.get("PATH"), os.environ.get("PATH")):
        if path:
            found = shutil.which("py-spy", path=path)
            if found:
                return found
    return None


def py_spy_dump(py_spy: str, pid: int, timeout: float) -> Optional[str]:
    """py-spy's dump of one process (without pausing it: --nonblocking); None when it could not take one."""
    try:
        done = subprocess.run([py_spy, "dump", "--nonblocking", "--pid", str(pid)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    text = done.stdout[:TEXT_MAX].decode("utf-8", "replace")
    return text if done.returncode == 0 and "Thread " in text else None


def kernel_view(pid: int) -> str:
    """Each thread as the kernel sees it: name, state, wait channel, the syscall, its kernel stack if readable."""
    lines = []
    try:
        tids = sorted(int(t) for t in os.listdir("/proc/%d/task" % pid) if t.isdigit())
    except OSError:
        return "pid %d: gone\n" % pid
    for tid in tids[:256]:
        base = "/proc/%d/task/%d/" % (pid, tid)
        stat = _read(base + "stat")
        state = stat.rsplit(")", 1)[1].split()[0] if ")" in stat else "?"
        lines.append("Thread %d (%s): state %s, wchan %s, syscall %s" % (
            tid, _read(base + "comm").strip(), state, _read(base + "wchan").strip() or "-",
            (_read(base + "syscall").split() or ["-"])[0]))
        lines.extend("    " + frame for frame in _read(base + "stack").splitlines()[:16])
    return "\n".join(lines) + "\n"


def process_state(pid: int) -> str:
    """The process's scheduler state and wait channel, as one line (`state T, wchan do_signal_stop`: stopped)."""
    stat = _read("/proc/%d/stat" % pid)
    state = stat.rsplit(")", 1)[1].split()[0] if ")" in stat else "?"
    return "Process %d: state %s, wchan %s" % (pid, state, _read("/proc/%d/wchan" % pid).strip() or "-")


def top_frames(text: str) -> List[str]:
    """The lines that say where each thread waits: each thread's header and its innermost frames."""
    out: List[str] = []
    per_thread = 0
    for line in text.splitlines():
        if line.startswith("Thread "):
            out.append(line.strip())
            per_thread = 0
        elif line.startswith(" ") and line.strip() and out and per_thread < 3:
            out.append("  " + line.strip())
            per_thread += 1
        if len(out) >= TOP_LINES:
            break
    return out


def dump_stacks(pgid: Any, path: str, env: Dict[str, str]) -> Dict[str, Any]:
    """Writes the stacks of the group's processes to `path`; the summary {file, method, processes: [{pid, argv,
    method, top}]}."""
    started = time.monotonic()
    pids = group_pids(pgid)[:MAX_PROCESSES] if isinstance(pgid, int) and pgid > 1 else []
    processes, parts, methods = [], [], set()
    for pid in pids:
        left = DUMP_BUDGET_S - (time.monotonic() - started)
        py_spy = find_py_spy(pid, env) if left > 1 else None
        text = py_spy_dump(py_spy, pid, min(PY_SPY_TIMEOUT_S, left)) if py_spy else None
        method = "py-spy" if text is not None else "proc"
        if text is None:
            text = kernel_view(pid)
        methods.add(method)
        argv = _read("/proc/%d/cmdline" % pid, 4096).replace("\0", " ").strip()
        kernel = process_state(pid)  # py-spy shows a stopped process's frames, not that it is stopped
        parts.append("==== pid %d (%s): %s ====\n%s\n%s" % (pid, method, argv, kernel, text))
        processes.append({"pid": pid, "argv": argv[:200], "method": method, "top": [kernel] + top_frames(text)})
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o640)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("\n".join(parts) or "no process left in group %s\n" % pgid)
        written: Optional[str] = os.path.basename(path)
    except OSError:
        written = None
    return {"file": written, "method": "+".join(sorted(methods)) or "none", "processes": processes,
            "took_s": round(time.monotonic() - started, 2)}
