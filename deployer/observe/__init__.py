"""What a running server does, read from the engine itself: pure functions over text, no I/O beyond reading a file
the caller names.

    prometheus   the Prometheus text exposition format (as the real engines emit it) -> typed families;
                 histogram quantiles as PromQL's histogram_quantile computes them; increases and rates between
                 two scrapes (counter resets handled)
    names        the per-engine metric-name maps (data in each engine's package, metrics.yaml) and their loader
    serving      ServingMetrics: one typed snapshot (requests, KV cache, throughput, latency quantiles,
                 preemptions, errors) from one or two scrapes and an engine's name map; absent stays absent
    timeline     a start's phase timeline, the prediction from earlier starts with the same key, the overrun
                 check, and the rule behind `startup_timeout_s: auto`

Fetching /metrics (the helper conversation), showing it (status, top) and storing timelines (history) belong to
their callers; nothing here talks to a target.
"""
