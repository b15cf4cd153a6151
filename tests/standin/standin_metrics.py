"""STAND-IN for tests: the /metrics of the stand-in engines (stdlib only); never used by the product.

A real engine's /metrics capture (tests/cases/metrics/<release>/*.prom, with its provenance) replayed line for line,
every family, label and HELP/TYPE line as the real engine wrote it, with the serving series advanced by what this
stand-in served: each chat completion adds its tokens (the usage its answer reports: 12 prompt, 10 generated) to
the token counters, one success to the request counters, and its latencies (TTFT, inter-token, end-to-end) to the
histograms' buckets, `_count` and `_sum`; the running-requests gauge is the number of completions in flight.
tests/unit/test_standin_metrics.py checks the served text against the capture (same series, same types).
"""

import re
import threading
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

CAPTURES = Path(__file__).resolve().parents[1] / "cases" / "metrics"
PROMPT_TOKENS, GENERATED_TOKENS = 12, 10           # the usage the stand-ins' chat answers report
TTFT_S, ITL_S, E2E_S = 0.02, 0.005, 0.065          # what each stand-in completion "took"

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)(.*)$")
_LE = re.compile(r'le="([^"]+)"')

Rule = Tuple[str, Sequence[str], float]            # sample name, label texts it must contain, increment per request
HistogramRule = Tuple[str, Sequence[str], float, int]   # base name, label texts, observed seconds, observations


class Replay:
    """One engine's capture and the rules by which a completion advances it."""

    def __init__(self, capture: str, counters: List[Rule], histograms: List[HistogramRule], running: str) -> None:
        self.lines = (CAPTURES / capture).read_text(encoding="utf-8").splitlines()
        self.counters, self.histograms, self.running = counters, histograms, running
        self.done = 0
        self.in_flight = 0
        self.lock = threading.Lock()

    def started(self) -> None:
        with self.lock:
            self.in_flight += 1

    def finished(self) -> None:
        with self.lock:
            self.in_flight -= 1
            self.done += 1

    def text(self) -> str:
        with self.lock:
            done, in_flight = self.done, self.in_flight
        return "\n".join(self._line(line, done, in_flight) for line in self.lines) + "\n"

    def _line(self, line: str, done: int, in_flight: int) -> str:
        match = _SAMPLE.match(line)
        if match is None:
            return line
        name, labels, value, rest = match.group(1), match.group(2) or "", float(match.group(3)), match.group(4)
        grown = self._grown(name, labels, done, in_flight)
        if grown is None:
            return line
        return "%s%s %r%s" % (name, labels, value + grown if name != self.running else grown, rest)

    def _grown(self, name: str, labels: str, done: int, in_flight: int) -> Optional[float]:
        if name == self.running:
            return float(in_flight)
        for rule_name, needs, step in self.counters:
            if name == rule_name and all(n in labels for n in needs):
                return done * step
        for base, needs, seconds, n in self.histograms:
            if not name.startswith(base) or not all(x in labels for x in needs):
                continue
            suffix = name[len(base):]
            if suffix == "_count":
                return float(done * n)
            if suffix == "_sum":
                return done * n * seconds
            if suffix == "_bucket":
                le = _LE.search(labels)
                bound = float(le.group(1)) if le else float("inf")
                return float(done * n) if seconds <= bound else 0.0
        return None


def vllm() -> Replay:
    """vLLM 0.32.0's /metrics after /health (every series at 0), advanced per completion."""
    return Replay("vllm-0.32.0/before.prom", [
        ("vllm:prompt_tokens_total", (), PROMPT_TOKENS),
        ("vllm:generation_tokens_total", (), GENERATED_TOKENS),
        ("vllm:request_success_total", ('finished_reason="stop"',), 1),
    ], [
        ("vllm:time_to_first_token_seconds", (), TTFT_S, 1),
        ("vllm:inter_token_latency_seconds", (), ITL_S, GENERATED_TOKENS - 1),
        ("vllm:e2e_request_latency_seconds", (), E2E_S, 1),
    ], running="vllm:num_requests_running")


def sglang() -> Replay:
    """SGLang 0.5.23's /metrics (--enable-metrics) after its capture's requests, advanced per completion (a
    multiprocess-mode counter has no series before its first increment: the later capture has them all)."""
    plain = ('is_streaming="false"',)
    return Replay("sglang-0.5.23/after.prom", [
        ("sglang:prompt_tokens_total", plain, PROMPT_TOKENS),
        ("sglang:generation_tokens_total", plain, GENERATED_TOKENS),
        ("sglang:num_requests_total", plain, 1),
        ("sglang:http_responses_total", ('endpoint="/v1/chat/completions"', 'status_code="200"'), 1),
    ], [
        ("sglang:time_to_first_token_seconds", plain, TTFT_S, 1),
        ("sglang:inter_token_latency_seconds", (), ITL_S, GENERATED_TOKENS - 1),
        ("sglang:e2e_request_latency_seconds", plain, E2E_S, 1),
    ], running="sglang:num_running_reqs")

