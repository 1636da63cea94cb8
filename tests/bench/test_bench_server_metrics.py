"""bench serve's server-side split of TTFT (runtime/tools/bench/server_metrics.py): the request-phase
histograms parsed from Prometheus' own text exposition (prometheus_client writes it, as the server's
/metrics does), summed over label sets, and the difference of two scrapes."""

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from pagoda.runtime.tools.bench.server_metrics import delta, parse


def exposition(observations: dict[str, list[float]], models=("a", "b")) -> str:
    """A registry with the three histograms under vLLM's names, each observation made once per model."""
    registry = CollectorRegistry()
    names = {"queue": "vllm:request_queue_time_seconds", "prefill": "vllm:request_prefill_time_seconds",
             "ttft": "vllm:time_to_first_token_seconds"}
    for phase, name in names.items():
        h = Histogram(name, phase, ["model_name"], buckets=[0.05, 0.1, 0.3], registry=registry)
        for model in models:
            for v in observations.get(phase, []):
                h.labels(model).observe(v)
    return generate_latest(registry).decode()


def test_parse_sums_every_label_set():
    got = parse(exposition({"queue": [0.01, 0.2], "prefill": [0.06], "ttft": [0.4]}))
    assert got["queue"]["count"] == 4 and abs(got["queue"]["sum"] - 0.42) < 1e-9
    assert got["queue"]["buckets"] == {"0.05": 2, "0.1": 2, "0.3": 4, "+Inf": 4}
    assert got["prefill"]["buckets"]["0.05"] == 0 and got["prefill"]["buckets"]["0.1"] == 2
    assert got["ttft"]["buckets"]["0.3"] == 0 and got["ttft"]["buckets"]["+Inf"] == 2


def test_delta_is_what_the_run_added():
    before = parse(exposition({"queue": [0.01], "prefill": [0.02]}, models=("a",)))
    after = parse(exposition({"queue": [0.01, 0.2, 0.25], "prefill": [0.02, 0.09, 0.07]}, models=("a",)))
    run = delta(before, after)
    assert run["queue"]["count"] == 2 and abs(run["queue"]["mean_ms"] - 225.0) < 1e-6
    assert run["queue"]["buckets"] == {"0.05": 0, "0.1": 0, "0.3": 2, "+Inf": 2}
    assert run["prefill"]["count"] == 2 and abs(run["prefill"]["mean_ms"] - 80.0) < 1e-6
    assert run["ttft"]["count"] == 0 and run["ttft"]["mean_ms"] is None
    assert delta(None, after) is None and delta(before, None) is None


def test_other_metrics_and_a_gauge_of_the_same_name_are_ignored():
    text = exposition({"queue": [0.1]}) + "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 3.0\n"
    assert set(parse(text)) == {"queue", "prefill", "ttft"}
    assert parse("# TYPE vllm:request_queue_time_seconds gauge\nvllm:request_queue_time_seconds 1.0\n") == {}
