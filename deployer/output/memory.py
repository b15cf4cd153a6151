"""The memory plan as a picture: one bar per GPU the engine uses, its cells split between weights, KV cache, Mamba
state, activations and graphs, and headroom, fitted to the width it is given; a legend with each part's size, and
what the engine really allocated (from its log) beside deployer's estimate.

On a terminal the parts are drawn in shades of a block (no colour: stdout's print edge strips escape sequences);
piped, in letters (`W K M A .`), so a log or a grep reads it. Pure: values and a width in, lines out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from deployer.engines.base import GpuBudget, KvAllocated

MIN_BAR = 10


@dataclass(frozen=True)
class Glyphs:
    """The cell of each part, in MemoryBudget.PARTS order, then headroom and over-commitment."""

    parts: tuple[str, str, str, str]
    headroom: str
    over: str


TERMINAL = Glyphs(("\u2588", "\u2593", "\u2592", "\u2591"), "\u00b7", "!")
PLAIN = Glyphs(("W", "K", "M", "A"), ".", "!")
LABELS = ("weights", "KV cache", "Mamba state", "activations+graphs")


def gib(mib: float) -> str:
    return f"{mib / 1024:.1f} GiB"


def cells(sizes: Sequence[float], width: int) -> list[int]:
    """`width` cells shared by `sizes` in proportion (largest remainders), a part that is not 0 getting at least
    one while there are cells to give."""
    total = sum(sizes)
    if total <= 0 or width <= 0:
        return [0 for _ in sizes]
    exact = [s * width / total for s in sizes]
    out = [int(e) for e in exact]
    for i in sorted(range(len(sizes)), key=lambda i: exact[i] - out[i], reverse=True)[:width - sum(out)]:
        out[i] += 1
    for i, size in enumerate(sizes):   # a small part stays visible, taken from the largest
        if size > 0 and out[i] == 0:
            big = max(range(len(out)), key=lambda j: out[j])
            if out[big] > 1:
                out[big] -= 1
                out[i] = 1
    return out


ROUNDING_MIB = 64.0   # a plan within this of the total is drawn as full (its parts are rounded estimates)


def headroom(gpu: GpuBudget) -> float:
    rest = gpu.budget.headroom_mib
    return 0.0 if -ROUNDING_MIB < rest < 0 else rest


def bar(gpu: GpuBudget, width: int, glyphs: Glyphs) -> str:
    """`[...]` in `width` cells (at least MIN_BAR inside): the parts on the GPU's total, then the headroom; a plan
    over the total is drawn on what it uses, its cells beyond the total marked `!`."""
    inner = max(width - 2, MIN_BAR)
    b = gpu.budget
    parts = [max(float(getattr(b, p)), 0.0) for p in b.PARTS]
    rest = headroom(gpu)
    counts = cells(parts + [max(rest, 0.0)], inner)
    text = "".join(g * n for g, n in zip(glyphs.parts, counts)) + glyphs.headroom * counts[-1]
    if rest < 0:
        over = min(max(1, round(inner * -rest / max(b.used_mib, 1e-9))), inner)
        text = text[:inner - over] + glyphs.over * over
    return f"[{text}]"


def legend(gpu: GpuBudget, glyphs: Glyphs, width: int) -> list[str]:
    """The parts with their sizes, wrapped to `width` (a part that is 0 is left out, headroom never)."""
    b = gpu.budget
    items = [f"{g} {label} {gib(float(getattr(b, p)))}"
             for g, label, p in zip(glyphs.parts, LABELS, b.PARTS) if float(getattr(b, p)) > 0]
    rest = headroom(gpu)
    items.append(f"{glyphs.headroom} headroom {gib(rest)}" if rest >= 0 else
                 f"{glyphs.over} over the GPU by {gib(-rest)}")
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + 2 + len(item) <= width:
            lines[-1] += "  " + item
        else:
            lines.append(item)
    return lines


def budget_lines(gpus: Sequence[GpuBudget], width: int, terminal: bool) -> list[str]:
    """The picture: a title line per GPU, its bar and its legend, each line at most `width` characters (a bar
    never narrower than MIN_BAR cells)."""
    glyphs = TERMINAL if terminal else PLAIN
    lines = ["memory per GPU:"]
    for gpu in gpus:
        name = f" {gpu.name}" if gpu.name else ""
        lines.append(f"  GPU {gpu.gpu}{name}: {gib(gpu.budget.total_mib)}")
        lines.append("  " + bar(gpu, width - 2, glyphs))
        lines += ["    " + line for line in legend(gpu, glyphs, width - 4)]
    return [cut(line, max(width, MIN_BAR + 4), terminal) for line in lines]


def cut(line: str, width: int, terminal: bool) -> str:
    """The line in at most `width` characters, cut at its end with an ellipsis (`...` when piped)."""
    if len(line) <= width:
        return line
    mark = "\u2026" if terminal else "..."
    return line[:max(width - len(mark), 0)] + mark


def allocated_lines(estimate: KvAllocated | None, allocated: KvAllocated | None, run_id: str | None) -> list[str]:
    """What the engine allocated for its KV cache (its log, run `run_id`) beside deployer's estimate."""
    if allocated is None:
        return []
    lines = [f"KV cache the engine allocated (run {run_id}): {_kv(allocated)}"]
    if estimate is not None:
        lines.append(f"  deployer's estimate: {_kv(estimate)}")
    lines.append(f"  from: {allocated.line}")
    return lines


def _kv(kv: KvAllocated) -> str:
    tokens = f"{kv.tokens:,} tokens" if kv.tokens is not None else "tokens not said"
    size = gib(kv.mib) if kv.mib is not None else "size not said"
    return f"{tokens}, {size}"
