"""The Prometheus text parser, histogram quantiles and counter increases: against the real /metrics captures of
vLLM 0.32.0 and SGLang 0.5.23 (tests/cases/metrics/, numbers checked by hand against the capture and the
requests its provenance.yaml says were sent), and against small texts for the edge cases of the format."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer.observe.prometheus import (
    Bucket, Exposition, MetricsUnreadable, MetricType, Scrape, counter_increase, histogram_quantile, increase, parse,
    parse_sample, rate,
)

METRICS = Path(__file__).resolve().parents[1] / "cases" / "metrics"
VLLM = METRICS / "vllm-0.32.0"
SGLANG = METRICS / "sglang-0.5.23"


def _scrape(folder: Path, name: str) -> Exposition:
    return parse((folder / f"{name}.prom").read_text(encoding="utf-8"))


def _provenance(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((folder / "provenance.yaml").read_text(encoding="utf-8"))
    return data


def _sent(folder: Path, key: str) -> int:
    prov = _provenance(folder)
    return sum(int(r[key]) for r in prov["sequential"] + prov["concurrent"])


# --- the real captures -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("folder", [VLLM, SGLANG], ids=["vllm", "sglang"])
@pytest.mark.parametrize("name", ["before", "during", "after"])
def test_every_line_of_a_real_capture_is_read(folder: Path, name: str) -> None:
    text = (folder / f"{name}.prom").read_text(encoding="utf-8")
    exposition = parse(text)
    samples = sum(len(f.samples) for f in exposition.families.values())
    assert samples == sum(1 for line in text.splitlines() if line.strip() and not line.startswith("#"))
    typed = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    assert typed <= set(exposition.families), "every TYPE line names a family"
    assert all(f.type is not MetricType.UNTYPED for f in exposition.families.values())


def test_vllm_families_carry_their_types_help_and_suffixed_samples() -> None:
    after = _scrape(VLLM, "after")
    counter = after.family("vllm:prompt_tokens_total")
    assert counter is not None and counter.type is MetricType.COUNTER
    assert counter.help == "Number of prefill tokens processed."
    created = after.family("vllm:prompt_tokens_created")   # prometheus_client writes it as a gauge family
    assert created is not None and created.type is MetricType.GAUGE and created.samples[0].value > 1.7e9
    ttft = after.family("vllm:time_to_first_token_seconds")
    assert ttft is not None and ttft.type is MetricType.HISTOGRAM
    assert {s.name for s in ttft.samples} == {"vllm:time_to_first_token_seconds_bucket",
                                              "vllm:time_to_first_token_seconds_count",
                                              "vllm:time_to_first_token_seconds_sum"}
    inf = [s for s in ttft.samples if s.label("le") == "+Inf"]
    assert len(inf) == 1 and inf[0].value == 9.0   # 4 sequential + 4 concurrent + the aborted stream's first token
    # a histogram whose own name ends in _total keeps its buckets
    iteration = after.family("vllm:iteration_tokens_total")
    assert iteration is not None and iteration.type is MetricType.HISTOGRAM
    assert any(s.name == "vllm:iteration_tokens_total_bucket" for s in iteration.samples)


def test_vllm_counters_grow_by_what_was_sent() -> None:
    before, during, after = (_scrape(VLLM, n) for n in ("before", "during", "after"))
    # during: every request had been prefilled; 4 sequential + 4 concurrent prompts
    assert counter_increase(before, during, "vllm:prompt_tokens_total") == _sent(VLLM, "prompt_tokens") == 212
    # after: plus the dropped stream's prompt ("Say hello.", the same 24 tokens as the first sequential request)
    first = _provenance(VLLM)["sequential"][0]["prompt_tokens"]
    assert counter_increase(before, after, "vllm:prompt_tokens_total") == 212 + first == 236
    grown = counter_increase(before, after, "vllm:generation_tokens_total")
    assert grown is not None and _sent(VLLM, "completion_tokens") == 1656 <= grown <= 1656 + 384
    done = counter_increase(before, after, "vllm:request_success_total", {"finished_reason": "length"})
    assert done == 8.0   # every answered request hit max_tokens
    assert counter_increase(before, after, "vllm:request_success_total", {"finished_reason": "error"}) == 0.0
    assert counter_increase(before, after, "vllm:no_such_total") is None


def test_vllm_running_gauge_during_the_concurrent_requests() -> None:
    during = _scrape(VLLM, "during")
    running = during.samples("vllm:num_requests_running")
    assert [s.value for s in running] == [4.0]
    assert running[0].labels == (("engine", "0"), ("model_name", "/root/.cache/deployer/tiny-llama"))


def test_vllm_e2e_quantiles_by_hand() -> None:
    # after.prom: e2e buckets le=0.3 -> 4 (the sequential requests), le=1.5 -> 8 (the concurrent ones), +Inf 8.
    hist = _scrape(VLLM, "after").histogram("vllm:e2e_request_latency_seconds")
    assert hist is not None and hist.count == 8.0
    assert hist.quantile(0.5) == pytest.approx(0.3)                       # rank 4: the top of the first bucket
    assert hist.quantile(0.99) == pytest.approx(1.0 + 0.5 * (7.92 - 4) / 4)   # rank 7.92 inside (1.0, 1.5]
    assert hist.quantile(0.25) == pytest.approx(0.3 * 2 / 4)              # from the natural lower bound 0
    assert hist.sum == pytest.approx(6.025000333786011)


def test_sglang_ttft_summed_by_le_over_streaming_and_not_and_over_the_interval() -> None:
    before, after = _scrape(SGLANG, "before"), _scrape(SGLANG, "after")
    total = after.histogram("sglang:time_to_first_token_seconds")
    assert total is not None and total.count == 10.0   # warmup + 8 + the dropped stream (is_streaming="true")
    # summed by le: 0.1 -> 8, 0.2 -> 9, 0.4 -> 10
    assert total.quantile(0.5) == pytest.approx(0.1 * 5 / 8)
    assert total.quantile(0.99) == pytest.approx(0.2 + 0.2 * (9.9 - 9) / 1)
    earlier = before.histogram("sglang:time_to_first_token_seconds")
    assert earlier is not None and earlier.count == 1.0   # SGLang's own warmup request, before ours
    window = total.since(earlier)
    assert window.count == 9.0
    assert window.quantile(0.5) == pytest.approx(0.1 * 4.5 / 8)
    assert window.quantile(0.99) == pytest.approx(0.1 + 0.1 * (8.91 - 8) / 1)
    only_streamed = after.histogram("sglang:time_to_first_token_seconds", {"is_streaming": "true"})
    assert only_streamed is not None and only_streamed.count == 1.0


def test_sglang_prompt_tokens_count_both_streaming_series() -> None:
    before, after = _scrape(SGLANG, "before"), _scrape(SGLANG, "after")
    first = _provenance(SGLANG)["sequential"][0]["prompt_tokens"]
    assert counter_increase(before, after, "sglang:prompt_tokens_total") == _sent(SGLANG, "prompt_tokens") + first
    seconds = _provenance(SGLANG)["scrapes_unix_time"]
    per_s = rate(Scrape(seconds["before"], before), Scrape(seconds["after"], after), "sglang:prompt_tokens_total")
    assert per_s == pytest.approx(236 / (seconds["after"] - seconds["before"]))


# --- the format's edge cases ------------------------------------------------------------------------------------

def test_label_escapes_trailing_comma_timestamp_and_specials() -> None:
    text = (
        '# HELP odd_total A help with a \\\\ backslash\\nand a newline.\n'
        '# TYPE odd_total counter\n'
        'odd_total{path="C:\\\\dir",quote="say \\"hi\\"",nl="a\\nb",} 3 1700000000000\n'
        'odd_created 1.7e9\n'
        '# TYPE g gauge\n'
        'g{x="1"} +Inf\n'
        'g{x="2"} -Inf\n'
        'g{x="3"} NaN\n'
        'g{x="4"} 1e-3\n'
    )
    exp = parse(text)
    odd = exp.family("odd_total")
    assert odd is not None and odd.help == "A help with a \\ backslash\nand a newline."
    sample = odd.samples[0]
    assert sample.label("path") == "C:\\dir" and sample.label("quote") == 'say "hi"' and sample.label("nl") == "a\nb"
    assert sample.value == 3.0 and sample.timestamp == 1700000000000
    values = [s.value for s in exp.samples("g")]
    assert values[0] == math.inf and values[1] == -math.inf and math.isnan(values[2]) and values[3] == 0.001
    assert exp.family("odd_created") is not None   # no TYPE: a family (untyped) of its own name
    assert exp.family("odd_created").type is MetricType.UNTYPED  # type: ignore[union-attr]


def test_openmetrics_counter_family_owns_total_and_created_and_eof_stops() -> None:
    text = ('# TYPE req counter\n# UNIT req requests\nreq_total 5 # {trace_id="abc"} 1.0 123\nreq_created 1.7e9\n'
            '# EOF\nthis is not read\n')
    exp = parse(text)
    family = exp.family("req")
    assert family is not None and [s.name for s in family.samples] == ["req_total", "req_created"]
    assert family.samples[0].value == 5.0 and family.samples[0].timestamp is None   # the exemplar is dropped


def test_summary_quantile_samples_and_quoted_names() -> None:
    text = ('# TYPE rpc summary\nrpc{quantile="0.5"} 0.2\nrpc{quantile="0.99"} 0.9\nrpc_sum 12\nrpc_count 40\n'
            '{"my.dotted.metric", zone="a"} 7\n')
    exp = parse(text)
    rpc = exp.family("rpc")
    assert rpc is not None and rpc.type is MetricType.SUMMARY and len(rpc.samples) == 4
    dotted = exp.samples("my.dotted.metric")
    assert dotted[0].value == 7 and dotted[0].label("zone") == "a"


def test_samples_without_labels_and_with_empty_braces() -> None:
    assert parse_sample("up 1").labels == ()
    assert parse_sample("up{} 1").value == 1.0
    assert parse_sample("  up{a=\"b\"}   2   5").timestamp == 5


@pytest.mark.parametrize("line", ['bad{a="1" 2', 'bad{a=1} 2', "bad", "bad 1 2 3", 'bad{a="1"}2', "{} 1", "x one"])
def test_a_line_that_is_not_the_format_is_refused_naming_it(line: str) -> None:
    with pytest.raises(MetricsUnreadable) as caught:
        parse(f"# TYPE ok gauge\nok 1\n{line}\n")
    assert "line 3" in caught.value.message


# --- quantiles (PromQL's bucketQuantile) -----------------------------------------------------------------------

INF = math.inf


def _b(*pairs: tuple[float, float]) -> list[Bucket]:
    return [Bucket(u, c) for u, c in pairs]


def test_quantile_interpolates_linearly_inside_the_bucket() -> None:
    buckets = _b((1, 10), (2, 30), (4, 40), (INF, 40))
    assert histogram_quantile(0.5, buckets) == pytest.approx(1 + 1 * (20 - 10) / 20)
    assert histogram_quantile(0.25, buckets) == pytest.approx(1.0)       # rank 10: the top of the first bucket
    assert histogram_quantile(0.05, buckets) == pytest.approx(1 * 2 / 10)  # lower bound 0 in the first bucket
    assert histogram_quantile(1.0, buckets) == pytest.approx(4.0)
    assert histogram_quantile(0.0, buckets) == 0.0


def test_quantile_in_the_inf_bucket_is_the_second_highest_bound() -> None:
    assert histogram_quantile(0.99, _b((1, 1), (2, 2), (INF, 10))) == 2.0


def test_quantile_edge_cases() -> None:
    assert math.isnan(histogram_quantile(0.5, _b((1, 0), (INF, 0))))          # no observations
    assert math.isnan(histogram_quantile(0.5, _b((1, 3), (2, 5))))            # no +Inf bucket
    assert math.isnan(histogram_quantile(0.5, _b((INF, 5))))                  # fewer than two buckets
    assert math.isnan(histogram_quantile(0.5, []))
    assert math.isnan(histogram_quantile(math.nan, _b((1, 1), (INF, 1))))
    assert histogram_quantile(-0.1, _b((1, 1), (INF, 1))) == -INF
    assert histogram_quantile(1.1, _b((1, 1), (INF, 1))) == INF
    assert histogram_quantile(0.5, _b((-1, 4), (0, 6), (INF, 8))) == -1.0     # first bound <= 0 is returned


def test_quantile_sorts_merges_and_forces_monotonic_buckets() -> None:
    shuffled = _b((INF, 40), (2, 30), (1, 10), (4, 40))
    assert histogram_quantile(0.5, shuffled) == pytest.approx(1.5)
    # a dip (30 -> 25) is lifted to the envelope (30): rank 32 lies in (3, 4] with 30 below it, not 25
    assert histogram_quantile(0.5, _b((1, 10), (2, 30), (3, 25), (INF, 40))) == pytest.approx(1.5)
    assert histogram_quantile(0.8, _b((1, 10), (2, 30), (3, 25), (4, 35), (INF, 40))) == pytest.approx(3 + 2 / 5)
    # equal bounds are summed (two series of one bucket not summed by the caller)
    assert histogram_quantile(0.5, _b((1, 5), (1, 5), (2, 20), (INF, 20))) == pytest.approx(1.0)


# --- increases -------------------------------------------------------------------------------------------------

def test_increase_handles_a_reset() -> None:
    assert increase(10, 15) == 5
    assert increase(100, 30) == 30     # went down: counted up from 0 again


def test_counter_increase_sees_resets_new_series_and_created_changes() -> None:
    before = parse('# TYPE c counter\nc_total{a="1"} 100\nc_total{a="2"} 5\nc_total{a="3"} 7\n'
                   'c_created{a="3"} 1000\n')
    after = parse('# TYPE c counter\nc_total{a="1"} 30\nc_total{a="2"} 9\nc_total{a="3"} 8\nc_total{a="4"} 2\n'
                  'c_created{a="3"} 2000\n')
    # a=1 reset (30), a=2 grew (4), a=3 restarted though its value grew (8), a=4 is new (2)
    assert counter_increase(before, after, "c_total") == 30 + 4 + 8 + 2
    assert counter_increase(before, after, "c_total", {"a": "2"}) == 4


def test_histogram_since_a_restart_is_the_whole_later_histogram() -> None:
    before = parse('# TYPE h histogram\nh_bucket{le="1"} 8\nh_bucket{le="+Inf"} 10\nh_count 10\nh_sum 5\n')
    after = parse('# TYPE h histogram\nh_bucket{le="1"} 1\nh_bucket{le="+Inf"} 3\nh_count 3\nh_sum 2\n')
    then, now = before.histogram("h"), after.histogram("h")
    assert then is not None and now is not None
    assert now.since(then) == now
    grown = parse('# TYPE h histogram\nh_bucket{le="1"} 9\nh_bucket{le="+Inf"} 14\nh_count 14\nh_sum 9\n')
    window = grown.histogram("h")
    assert window is not None
    assert [b.count for b in window.since(then).buckets] == [1, 4] and window.since(then).count == 4


def test_a_bucket_without_le_is_ignored() -> None:
    exp = parse('h_bucket{le="1"} 2\nh_bucket 7\nh_bucket{le="+Inf"} 4\nh_count 4\nh_sum 3\n')
    hist = exp.histogram("h")
    assert hist is not None and [b.upper for b in hist.buckets] == [1, math.inf]
    assert hist.quantile(0.5) == pytest.approx(1.0)


def test_rate_needs_time_to_pass() -> None:
    exp = parse("# TYPE c counter\nc_total 1\n")
    assert rate(Scrape(10, exp), Scrape(10, exp), "c_total") is None
    assert rate(Scrape(10, parse("c_total 1\n")), Scrape(12, parse("c_total 5\n")), "c_total") == 2.0
