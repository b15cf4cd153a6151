"""STAND-IN for tests: imitates SGLang 0.5.23 (no GPU here); never used by the product.

A weight download as huggingface_hub draws it on stderr while SGLang's model loader fetches the files: one tqdm
bar per file (`unit="B", unit_scale=True, desc=<file name>`), redrawn with \\r and no newline at most every 0.1 s,
ended by a newline when the file is done. The text is tqdm's `format_meter` for a file that is not a terminal
(a 10-cell bar, SI prefixes with divisor 1000); tests/unit/test_progress.py checks it against the real tqdm.

Mode `download_quiet` is the same download as huggingface_hub really does it under a supervisor, whose stderr is
a file: tqdm's `disable=None` turns the bars off, so nothing is printed; the bytes grow in the hub cache instead,
`$HF_HUB_CACHE/models--ORG--NAME/blobs/<etag>.incomplete` (sparse files: the sizes are real, the disk is spared),
renamed to `<etag>` when complete.

Env knobs (mode `download`, `download_frozen`, `download_quiet`):

| env                       | default | meaning |
|---------------------------|---------|---------|
| STANDIN_DOWNLOAD_S        | 3       | seconds the whole download takes |
| STANDIN_DOWNLOAD_FILES    | 3       | safetensors files (model-0000i-of-0000N.safetensors) |
| STANDIN_DOWNLOAD_GB       | 54      | total size (decimal GB) |
| STANDIN_FREEZE_AT         | 0.4     | download_frozen: fraction of the first file where the transfer stops |
| STANDIN_FREEZE_REDRAW     | 1       | download_frozen: 1 keeps redrawing the stuck bar (its clock advances, its   |
|                           |         | count does not), 0 draws nothing more |
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request

UNICODE_BLOCKS = " " + "".join(chr(c) for c in range(0x258F, 0x2587, -1))  # " ▏▎▍▌▋▊▉█"
N_BARS = 10
MIN_INTERVAL_S = 0.1
FREEZE_CAP_S = 3600.0


def format_sizeof(num: float, divisor: float = 1000) -> str:
    for unit in ("", "k", "M", "G", "T", "P", "E", "Z"):
        if abs(num) < 999.5:
            if abs(num) < 99.95:
                if abs(num) < 9.995:
                    return f"{num:1.2f}{unit}"
                return f"{num:2.1f}{unit}"
            return f"{num:3.0f}{unit}"
        num /= divisor
    return f"{num:3.1f}Y"


def format_interval(seconds: float) -> str:
    mins, s = divmod(int(seconds), 60)
    h, m = divmod(mins, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def bar_cells(frac: float) -> str:
    nsyms = len(UNICODE_BLOCKS) - 1
    full, part = divmod(int(frac * N_BARS * nsyms), nsyms)
    cells = UNICODE_BLOCKS[-1] * full
    if full < N_BARS:
        cells += UNICODE_BLOCKS[part] + UNICODE_BLOCKS[0] * (N_BARS - full - 1)
    return cells


def format_bar(desc: str, n: float, total: float, elapsed: float) -> str:
    """One bar as tqdm prints it for unit="B", unit_scale=True (no terminal width known)."""
    rate = n / elapsed if elapsed else None
    if rate and rate < 1:  # tqdm inverts a rate below one unit a second
        rate_fmt = format_sizeof(1 / rate) + "s/B"
    else:
        rate_fmt = (format_sizeof(rate) if rate else "?") + "B/s"
    remaining = format_interval((total - n) / rate) if rate else "?"
    frac = n / total
    return (f"{desc}: {frac * 100:3.0f}%|{bar_cells(frac)}| {format_sizeof(n)}/{format_sizeof(total)} "
            f"[{format_interval(elapsed)}<{remaining}, {rate_fmt}]")


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw not in (None, "") else default


def _draw(text: str) -> None:
    sys.stderr.write("\r" + text)
    sys.stderr.flush()


def download(frozen: bool = False) -> None:
    """Draw the download of the model's files; `frozen`: the transfer stops part-way and never resumes."""
    seconds = _env_float("STANDIN_DOWNLOAD_S", 3.0)
    files = max(int(_env_float("STANDIN_DOWNLOAD_FILES", 3)), 1)
    size = _env_float("STANDIN_DOWNLOAD_GB", 54.0) * 1e9 / files
    per_file = seconds / files
    for index in range(1, files + 1):
        desc = f"model-{index:05d}-of-{files:05d}.safetensors"
        start = time.monotonic()
        _draw(format_bar(desc, 0, size, 0))
        while True:
            time.sleep(MIN_INTERVAL_S)
            elapsed = time.monotonic() - start
            frac = min(elapsed / per_file, 1.0) if per_file > 0 else 1.0
            if frozen and frac >= _env_float("STANDIN_FREEZE_AT", 0.4):
                _freeze(desc, size, start, frac)
            _draw(format_bar(desc, size * frac, size, elapsed))
            if frac >= 1.0:
                break
        sys.stderr.write("\n")
        sys.stderr.flush()


def download_quiet(model_path: str) -> None:
    """No output at all: the files grow in the hub cache (huggingface_hub's layout), then are renamed complete."""
    seconds = _env_float("STANDIN_DOWNLOAD_S", 3.0)
    files = max(int(_env_float("STANDIN_DOWNLOAD_FILES", 3)), 1)
    size = int(_env_float("STANDIN_DOWNLOAD_GB", 54.0) * 1e9 / files)
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub")
    blobs = os.path.join(hub, "models--" + model_path.replace("/", "--"), "blobs")
    os.makedirs(blobs, exist_ok=True)
    per_file = seconds / files
    for index in range(files):
        etag = f"{index:02d}" + "5a1d0c3e" * 8
        part = os.path.join(blobs, etag + ".incomplete")
        start = time.monotonic()
        while True:
            frac = min((time.monotonic() - start) / per_file, 1.0) if per_file > 0 else 1.0
            with open(part, "ab") as fh:
                fh.truncate(int(size * frac))
            if frac >= 1.0:
                break
            time.sleep(MIN_INTERVAL_S)
        os.replace(part, os.path.join(blobs, etag))


def _freeze(desc: str, size: float, started: float, frac: float) -> None:
    """The transfer stopped: the bar's count stays put until killed. Redrawn (tqdm's refresh: the clock advances,
    the rate falls, the count does not move), or not drawn at all."""
    redraw = os.environ.get("STANDIN_FREEZE_REDRAW", "1") != "0"
    deadline = time.monotonic() + FREEZE_CAP_S
    while time.monotonic() < deadline:
        if redraw:
            _draw(format_bar(desc, size * frac, size, time.monotonic() - started))
        time.sleep(0.5)


def download_hub(model_path: str) -> None:
    """Mode `download_hub`: every file of `main` fetched from HF_ENDPOINT (the bytes read and dropped)."""
    endpoint = os.environ["HF_ENDPOINT"].rstrip("/")
    with urllib.request.urlopen(f"{endpoint}/api/models/{model_path}/revision/main", timeout=30) as resp:
        listing = json.loads(resp.read())
    for sibling in listing["siblings"]:
        url = f"{endpoint}/{model_path}/resolve/{listing['sha']}/{sibling['rfilename']}"
        with urllib.request.urlopen(url, timeout=30) as resp:
            while resp.read(1 << 20):
                pass
