"""The process that steps each real engine, the one a hang test or bench freezes (SIGSTOP) with requests in flight:
vLLM's engine core and SGLang's scheduler, found by the title each engine gives it with setproctitle (which
also blanks its environ).

Shared by the real-engine tier (tests/real_engines/hangs.py: on the target, over its shell, since the test host
runs in a PID namespace of its own) and bench/hang.py (this machine's /proc), so the knowledge lives once.
"""

from __future__ import annotations

from collections.abc import Iterable

# vLLM 0.32.0: `VLLM::EngineCore` (v1/engine/core.py, set_process_title("EngineCore"); with data parallelism
# `VLLM::EngineCore_DP0`); SGLang 0.5.23: `sglang::scheduler` (`sglang::scheduler_TP0`... with tensor
# parallelism; managers/scheduler.py run_scheduler_process, setproctitle). A prefix match covers the suffixes.
CORE_TITLE = {"vllm": "VLLM::EngineCore", "sglang": "sglang::scheduler"}

# The processes of process group {pgid} whose title starts with {title}, one pid a line: a POSIX shell script
# (formatted with str.format) for the target's login shell.
TITLED_IN_GROUP = """for d in /proc/[0-9]*; do
  case "$(tr -d '\\0' < $d/cmdline 2>/dev/null)" in
    {title}*) [ "$(cut -d' ' -f5 $d/stat 2>/dev/null)" = {pgid} ] && echo ${{d#/proc/}};;
  esac
done"""


def titled_in_group(title: str, pgid: int) -> str:
    """The shell script that lists, on the target, the processes of group `pgid` titled `title`..."""
    return TITLED_IN_GROUP.format(title=title, pgid=int(pgid))


def title_of(pid: int) -> str:
    """The process's title as `ps` shows it (its cmdline, NULs dropped); "" when it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b"").decode(errors="replace")
    except OSError:
        return ""


def cores_among(kind: str, pids: Iterable[int]) -> list[int]:
    """Of `pids` (this machine's /proc), the engine's stepping processes (CORE_TITLE[kind])."""
    title = CORE_TITLE[kind]
    return [pid for pid in pids if title_of(pid).startswith(title)]
