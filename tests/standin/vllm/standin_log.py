"""STAND-IN for tests: imitates vLLM 0.33.0 (no GPU here); never used by the product.

vLLM's log line shapes: the logger prefix of logger.py:28 (`(APIServer pid=N) INFO 11-30 23:40:00 [file.py:L] `,
continued lines re-prefixed after `\\r\\n` as logging_utils/formatter.py:75 does), uvicorn's own lines, and
tracebacks whose frames name the real 0.33.0 files and lines.
"""

import os
import sys
import time
from typing import List, Optional, Tuple

SITE = "/usr/local/lib/python3.12/dist-packages/vllm/"
Frame = Tuple[str, int, str, str]  # (file under vllm/ or absolute, line, function, source line)


def prefix(proc: str, pid: int, level: str, where: str) -> str:
    return f"({proc} pid={pid}) {level} {time.strftime('%m-%d %H:%M:%S')} [{where}] "


def log(proc: str, pid: int, level: str, where: str, message: str) -> None:
    head = prefix(proc, pid, level, where)
    sys.stdout.write(head + message.replace("\n", "\r\n" + head) + "\n")
    sys.stdout.flush()


def uvicorn(level: str, message: str) -> None:
    sys.stderr.write(f"{level}:".ljust(10) + message + "\n")
    sys.stderr.flush()


def traceback_text(frames: List[Frame], exception: str) -> str:
    lines = ["Traceback (most recent call last):"]
    for file, line, func, code in frames:
        path = file if file.startswith("/") or file.startswith("<") else SITE + file
        lines.append(f'  File "{path}", line {line}, in {func}')
        if code:
            lines.append(f"    {code}")
    return "\n".join(lines + [exception])


def raw(text: str, stream=None) -> None:
    out = stream or sys.stderr
    out.write(text + "\n")
    out.flush()


def tqdm_bar(desc: str, total: int, unit_s: float = 0.0) -> None:
    """A tqdm bar as a terminal-less stderr sees it: \\r redraws, one final newline."""
    parts = []
    for done in (0, total // 2, total):
        pct = int(100 * done / max(total, 1))
        parts.append(f"{desc}: {pct:3d}%|{'#' * (pct // 10):<10}| {done}/{total} [00:0{done % 10}<00:00, 9.50it/s]")
    sys.stderr.write("\r".join(parts) + "\n")
    sys.stderr.flush()
    if unit_s:
        time.sleep(unit_s)


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


def env_str(name: str, default: Optional[str] = None) -> Optional[str]:
    value = os.environ.get(name)
    return value if value not in (None, "") else default
