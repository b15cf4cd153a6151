"""STAND-IN for tests: the /metrics of the stand-in engines (stdlib only); never used by the product.

A real engine's /metrics capture (tests/cases/metrics/<release>/*.prom, with its provenance) replayed line for line,
every family, label and HELP/TYPE line as the real engine wrote it, with the serving series advanced by what this
stand-in served: each chat completion adds its tokens (the usage its answer reports: 12 prompt, 10 generated) to
the token counters, one success to the request counters, and its latencies (TTFT, inter-token, end-to-end) to the
histograms' buckets, `_count` and `_sum`; the running-requests gauge is the number of completions in flight.
tests/unit/test_standin_metrics.py checks the served text against the capture (same series, same types).

Two knobs make a "worse release" for the canary tests (tests/integration/test_fleet_canary_rollout.py), both read from the
engine's environment at start: STANDIN_SLOWER_X (a float, default 1) makes every completion that many times
slower, in what it reports (TTFT, inter-token, end-to-end) and, for the SGLang stand-in, in the time it really takes
(STANDIN_CHAT_DELAY_S times it); STANDIN_FAIL_EVERY=N makes the SGLang stand-in answer every Nth chat completion
with HTTP 500, counted as prometheus_client would (a `status_code="500"` series of sglang:http_responses_total,
written at its first increment).
"""

import os
import re
import threading
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

CAPTURES = Path(__file__).resolve().parents[1] / "cases" / "metrics"
PROMPT_TOKENS, GENERATED_TOKENS = 12, 10           # the usage the stand-ins' chat answers report
TTFT_S, ITL_S, E2E_S = 0.02, 0.005, 0.065          # what each stand-in completion "took"

SLOWER_VAR, FAIL_EVERY_VAR = "STANDIN_SLOWER_X", "STANDIN_FAIL_EVERY"


def slower() -> float:
    """STANDIN_SLOWER_X: how many times slower than the capture's stand-in every completion is (default 1)."""
    return float(os.environ.get(SLOWER_VAR, "1") or 1)


def fail_every() -> int:
    """STANDIN_FAIL_EVERY: every how many chat completions one answers HTTP 500 (0: none)."""
    return int(os.environ.get(FAIL_EVERY_VAR, "0") or 0)


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)(.*)$")
_LE = re.compile(r'le="([^"]+)"')

Rule = Tuple[str, Sequence[str], float]            # sample name, label texts it must contain, increment per request
HistogramRule = Tuple[str, Sequence[str], float, int]   # base name, label texts, observed seconds, observations


class Replay:
    """One engine's capture and the rules by which a completion advances it."""

    def __init__(self, capture: str, counters: List[Rule], histograms: List[HistogramRule], running: str,
                 error_after: Optional[str] = None, progress: Optional[Tuple[str, Sequence[str]]] = None) -> None:
        self.lines = (CAPTURES / capture).read_text(encoding="utf-8").splitlines()
        x = slower()
        self.counters, self.running = counters, running
        self.histograms = [(base, needs, seconds * x, n) for base, needs, seconds, n in histograms]
        self.error_after = error_after      # the sample line (as captured, up to its value) its 500 series follows
        self.progress = progress            # the per-step token counter (name, label texts) that `stepped` advances
        self.stepped_tokens = 0
        self.done = 0
        self.errors = 0
        self.in_flight = 0
        self.lock = threading.Lock()

    def failed(self) -> None:
        """A completion answered HTTP 500 (STANDIN_FAIL_EVERY)."""
        with self.lock:
            self.errors += 1

    def stepped(self, tokens: int) -> None:
        """An engine step that processed `tokens` tokens (the multi-node stand-in's scheduler loop)."""
        with self.lock:
            self.stepped_tokens += tokens

    def started(self) -> None:
        with self.lock:
            self.in_flight += 1

    def finished(self) -> None:
        with self.lock:
            self.in_flight -= 1
            self.done += 1

    def text(self) -> str:
        with self.lock:
            done, in_flight, errors, stepped = self.done, self.in_flight, self.errors, self.stepped_tokens
        out = []
        for line in self.lines:
            out.append(self._line(line, done, in_flight, stepped))
            if errors and self.error_after and line.startswith(self.error_after + " "):
                out.append('%s %r' % (self.error_after.replace('status_code="200"', 'status_code="500"'),
                                      float(errors)))
        return "\n".join(out) + "\n"

    def _line(self, line: str, done: int, in_flight: int, stepped: int = 0) -> str:
        match = _SAMPLE.match(line)
        if match is None:
            return line
        name, labels, value, rest = match.group(1), match.group(2) or "", float(match.group(3)), match.group(4)
        if self.progress is not None and name == self.progress[0] and all(n in labels for n in self.progress[1]):
            return "%s%s %r%s" % (name, labels, value + stepped, rest)
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
    ], running="sglang:num_running_reqs", progress=("sglang:realtime_tokens_total", ('mode="decode"',)),
        error_after='sglang:http_responses_total{endpoint="/v1/chat/completions",method="POST",status_code="200"}')

