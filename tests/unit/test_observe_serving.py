"""ServingMetrics and the engines' metric-name maps, against the real /metrics captures (tests/cases/metrics/):
what was sent shows up, what the engine does not expose stays absent (None), never 0."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer.observe.names import MetricNames, MetricNamesUnreadable, Quantity, load_metric_names
from deployer.observe.prometheus import Scrape, parse
from deployer.engines import engine_for
from deployer.observe.serving import Count, ServingMetrics, Window

ROOT = Path(__file__).resolve().parents[2]
METRICS = ROOT / "tests" / "cases" / "metrics"
CAPTURES = {"vllm": METRICS / "vllm-0.32.0", "sglang": METRICS / "sglang-0.5.23"}


def _names(engine: str) -> MetricNames:
    path = engine_for(engine).knowledge.metrics  # the engine hands out its own map
    assert path is not None and path == ROOT / "deployer" / "engines" / engine / "metrics.yaml"
    return load_metric_names(path)


def _provenance(engine: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((CAPTURES[engine] / "provenance.yaml").read_text(encoding="utf-8"))
    return data


def _text(engine: str, name: str) -> str:
    return (CAPTURES[engine] / f"{name}.prom").read_text(encoding="utf-8")


def _scrape(engine: str, name: str, text: str | None = None) -> Scrape:
    at = _provenance(engine)["scrapes_unix_time"][name]
    return Scrape(at, parse(text if text is not None else _text(engine, name)))


def _without(text: str, metric: str) -> str:
    return "\n".join(line for line in text.splitlines() if metric not in line) + "\n"


# --- the maps ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("engine, release", [("vllm", "0.32.0"), ("sglang", "0.5.23")])
def test_each_map_names_its_release_and_where_each_name_was_read(engine: str, release: str) -> None:
    names = _names(engine)
    assert names.engine == engine and names.release == release
    assert set(names.metrics) == set(Quantity)   # both real engines expose every quantity
    for quantity, candidates in names.metrics.items():
        for name in candidates:
            assert name.release == release, quantity
            assert re.search(r"\.py:\d+", name.source), (quantity, name.source)
            assert name.name.startswith(f"{engine}:"), quantity


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_mapped_name_is_in_the_real_capture(engine: str) -> None:
    after = parse(_text(engine, "after"))
    for quantity, candidates in _names(engine).metrics.items():
        name = candidates[0]
        assert after.has(name.name) or (name.zero_while and after.has(name.zero_while)), (quantity, name.name)


def test_a_map_that_does_not_validate_is_refused_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "metrics.yaml"
    bad.write_text("engine: x\nrelease: 1.0\nmetrics:\n  requests_running: {name: a, kind: gauge}\n")
    with pytest.raises(MetricNamesUnreadable, match="metrics.yaml"):
        load_metric_names(bad)
    bad.write_text("engine: x\nrelease: 1.0\nmetrics:\n"
                   "  not_a_quantity: {name: a, kind: gauge, release: 1, source: s}\n")
    with pytest.raises(MetricNamesUnreadable):
        load_metric_names(bad)


# --- vLLM ------------------------------------------------------------------------------------------------------

def test_vllm_while_four_requests_run() -> None:
    before, during = _scrape("vllm", "before"), _scrape("vllm", "during")
    m = ServingMetrics.from_scrapes(_names("vllm"), during, before)
    interval = during.at - before.at
    assert m.interval_s == pytest.approx(interval)
    assert m.requests_running == 4.0 and m.requests_waiting == 0.0
    assert m.kv_cache_usage is not None and 0 < m.kv_cache_usage < 0.01
    sent = _provenance("vllm")
    prompt = sum(r["prompt_tokens"] for r in sent["sequential"] + sent["concurrent"])
    assert m.prompt_tokens_per_s == pytest.approx(prompt / interval)
    assert m.generation_tokens_per_s is not None and m.generation_tokens_per_s > 0
    ttft = m.latency[Quantity.TIME_TO_FIRST_TOKEN]
    assert ttft.window is Window.INTERVAL and ttft.count == 8.0
    assert m.preemptions == Count(0.0, 0.0) and m.request_errors == Count(0.0, 0.0)
    assert m.absent == ()
    line = m.summary()
    assert line.startswith("4 running, 0 waiting, KV 0.1%; prompt ") and "not exposed" not in line


def test_vllm_after_the_interval_quantiles_by_hand() -> None:
    m = ServingMetrics.from_scrapes(_names("vllm"), _scrape("vllm", "after"), _scrape("vllm", "before"))
    e2e = m.latency[Quantity.E2E_LATENCY]
    assert e2e.count == 8.0 and e2e.p50_s == pytest.approx(0.3) and e2e.p99_s == pytest.approx(1.49)
    assert m.requests_running == 0.0
    data = m.to_json()
    assert data["e2e_latency"] == {"p50_s": pytest.approx(0.3), "p99_s": pytest.approx(1.49), "count": 8.0,
                                   "window": "interval"}
    assert data["absent"] == [] and data["requests_running"] == 0.0


def test_one_scrape_gives_no_rates_and_lifetime_quantiles() -> None:
    m = ServingMetrics.from_scrapes(_names("vllm"), _scrape("vllm", "after"))
    assert m.interval_s is None and m.prompt_tokens_per_s is None and m.generation_tokens_per_s is None
    assert m.latency[Quantity.E2E_LATENCY].window is Window.SINCE_START
    assert m.preemptions == Count(0.0, None)
    assert Quantity.PROMPT_TOKENS not in m.absent   # exposed; just not measurable from one scrape


def test_no_requests_yet_is_not_absent() -> None:
    m = ServingMetrics.from_scrapes(_names("vllm"), _scrape("vllm", "before"))
    ttft = m.latency[Quantity.TIME_TO_FIRST_TOKEN]
    assert ttft.count == 0.0 and ttft.p50_s is None and ttft.p99_s is None
    assert "TTFT no requests" in m.summary()


# --- absent, never 0 ---------------------------------------------------------------------------------------------

def test_a_metric_the_engine_does_not_expose_is_none_not_zero() -> None:
    text = _without(_without(_text("vllm", "during"), "vllm:kv_cache_usage_perc"),
                    "vllm:inter_token_latency_seconds")
    before = _scrape("vllm", "before", _without(_text("vllm", "before"), "vllm:kv_cache_usage_perc"))
    m = ServingMetrics.from_scrapes(_names("vllm"), _scrape("vllm", "during", text), before)
    assert m.kv_cache_usage is None and Quantity.KV_CACHE_USAGE in m.absent
    assert Quantity.INTER_TOKEN_LATENCY not in m.latency and Quantity.INTER_TOKEN_LATENCY in m.absent
    assert m.to_json()["kv_cache_usage"] is None and m.to_json()["inter_token_latency"] is None
    assert "KV" not in m.summary() and "not exposed: kv_cache_usage, inter_token_latency" in m.summary()
    assert m.requests_running == 4.0   # the rest is still read


def test_a_quantity_missing_from_the_map_is_absent() -> None:
    names = _names("vllm")
    fewer = replace(names, metrics={k: v for k, v in names.metrics.items() if k is not Quantity.PREEMPTIONS})
    m = ServingMetrics.from_scrapes(fewer, _scrape("vllm", "after"), _scrape("vllm", "before"))
    assert m.preemptions is None and m.absent == (Quantity.PREEMPTIONS,)
    assert m.to_json()["preemptions"] is None


def test_a_gauge_whose_selectors_match_no_series_is_none_not_zero() -> None:
    names = _names("vllm")
    running = replace(names.metrics[Quantity.REQUESTS_RUNNING][0], match={"engine": "7"})
    other_engine = replace(names, metrics={**names.metrics, Quantity.REQUESTS_RUNNING: [running]})
    m = ServingMetrics.from_scrapes(other_engine, _scrape("vllm", "during"))
    assert m.requests_running is None and m.requests_waiting == 0.0


def test_a_scrape_with_none_of_the_names_is_all_absent() -> None:
    # an engine started without its metrics (SGLang without --enable-metrics, an unknown release): nothing reads 0
    empty = Scrape(1.0, parse("# TYPE other gauge\nother 1\n"))
    m = ServingMetrics.from_scrapes(_names("vllm"), empty)
    assert m.absent == tuple(Quantity)
    assert all(v is None for k, v in m.to_json().items() if k not in ("engine", "release", "at", "absent",
                                                                        "interval_s"))
    assert m.summary().startswith("not exposed: requests_running")


# --- SGLang ----------------------------------------------------------------------------------------------------

def test_sglang_counters_and_its_lazily_created_series() -> None:
    before, after = _scrape("sglang", "before"), _scrape("sglang", "after")
    m = ServingMetrics.from_scrapes(_names("sglang"), after, before)
    assert m.absent == ()
    # no retraction happened: the counter has no series yet, its collector's retraction gauge is there
    assert "sglang:num_retracted_requests_total" not in _text("sglang", "after")
    assert m.preemptions == Count(0.0, 0.0)
    # no 5xx answer from an inference endpoint (the 503s of /health during startup do not count)
    assert 'status_code="503"' in _text("sglang", "after")
    assert m.request_errors == Count(0.0, 0.0)
    ttft = m.latency[Quantity.TIME_TO_FIRST_TOKEN]
    assert ttft.count == 9.0 and ttft.p50_s == pytest.approx(0.05625) and ttft.p99_s == pytest.approx(0.191)


def test_sglang_inter_token_latency_before_its_first_observation_has_no_requests_not_absent() -> None:
    text = _text("sglang", "before")
    assert "sglang:inter_token_latency_seconds" not in text and "sglang:num_requests_total" in text
    m = ServingMetrics.from_scrapes(_names("sglang"), _scrape("sglang", "before"))
    itl = m.latency[Quantity.INTER_TOKEN_LATENCY]
    assert itl.count == 0 and itl.p50_s is None and Quantity.INTER_TOKEN_LATENCY not in m.absent


def test_sglang_without_the_witness_the_missing_counter_is_absent() -> None:
    text = _without(_text("sglang", "after"), "sglang:num_retracted_reqs")
    m = ServingMetrics.from_scrapes(_names("sglang"), _scrape("sglang", "after", text))
    assert m.preemptions is None and Quantity.PREEMPTIONS in m.absent


def test_sglang_a_server_error_of_an_inference_endpoint_counts() -> None:
    extra = ('sglang:http_responses_total{endpoint="/v1/chat/completions",method="POST",status_code="500"} 2.0\n'
             'sglang:http_responses_total{endpoint="/health",method="GET",status_code="500"} 5.0\n')
    anchor = "# HELP sglang:prompt_tokens_total"
    text = _text("sglang", "after").replace(anchor, extra + anchor)
    m = ServingMetrics.from_scrapes(_names("sglang"), _scrape("sglang", "after", text), _scrape("sglang", "before"))
    assert m.request_errors == Count(2.0, 2.0)
    assert "errors 2 (+2)" in m.summary()


# --- a restart between two scrapes ------------------------------------------------------------------------------

def test_a_counter_reset_between_scrapes_counts_from_zero() -> None:
    # the engine restarted between the two scrapes: the later one's prompt counter (50) is below the earlier (212)
    earlier = _scrape("vllm", "during")
    restarted = Scrape(earlier.at + 10, parse(_text("vllm", "after").replace(
        'vllm:prompt_tokens_total{engine="0",model_name="/root/.cache/deployer/tiny-llama"} 236.0',
        'vllm:prompt_tokens_total{engine="0",model_name="/root/.cache/deployer/tiny-llama"} 50.0')))
    m = ServingMetrics.from_scrapes(_names("vllm"), restarted, earlier)
    assert m.prompt_tokens_per_s == pytest.approx(50.0 / 10)
    assert m.generation_tokens_per_s == pytest.approx((1658.0 - 1293.0) / 10)   # no reset there
