"""`deploy top`'s table for people: one line per engine (deployer.deployments.top.TopRow), numbers the engine does
not expose (or rates before a second look) shown as "-"."""

from __future__ import annotations

from collections.abc import Sequence

from deployer.deployments.top import TopRow
from deployer.observe.serving import seconds

COLUMNS = ("DEPLOYMENT", "MEMBER", "HOST", "STATE", "RUN", "WAIT", "TOK/S", "KV%", "TTFT p99", "E2E p99", "RESTARTS")
WIDTHS = (18, 10, 22, 12, 5, 5, 8, 6, 9, 9, 8)


def _n(value: float | None, fmt: str = "{:g}") -> str:
    return "-" if value is None else fmt.format(value)


def _s(value: float | None) -> str:
    return "-" if value is None else seconds(value)


def row_cells(row: TopRow) -> tuple[str, ...]:
    state = row.state if row.healthy or row.state not in ("ready", "running") else f"{row.state}!"
    kv = None if row.kv_cache_usage is None else row.kv_cache_usage * 100
    if row.metrics_off:  # "off" where each number would be; the line below the table says how to turn them on
        return (row.deployment, row.member, row.host, state, *(["off"] * 6), _n(row.restarts))
    return (row.deployment, row.member, row.host, state, _n(row.requests_running), _n(row.requests_waiting),
            _n(row.generation_tokens_per_s, "{:.1f}"), _n(kv, "{:.1f}"), _s(row.ttft_p99_s), _s(row.e2e_p99_s),
            _n(row.restarts))


def _line(cells: Sequence[str]) -> str:
    return " ".join(c[:w].ljust(w) for c, w in zip(cells, WIDTHS)).rstrip()


def table(rows: Sequence[TopRow], problems: Sequence[str] = ()) -> list[str]:
    """The header, a line per row, then each row's error and each target that could not be read."""
    lines = [_line(COLUMNS), *(_line(row_cells(r)) for r in rows)]
    lines += [f"{r.deployment} {r.member}: {r.error}" for r in rows if r.error]
    lines += list(problems)
    return lines
