"""Prometheus metrics under vLLM's names (`vllm:`), each with a `model_name` label, so that dashboards,
alerts, KEDA triggers and the Gateway API Inference Extension's endpoint picker written for vLLM
work unchanged. Figures vLLM has no name for (the KV capacity in tokens) are `pagoda:`.

Two sources feed them. Gauges and the engine's own counters (preemptions, prefix cache) come from
the latest `EngineStats` snapshot, read at scrape time by a custom collector. Token counters and
latency histograms are fed by the frontend's OutputProcessor, whose clock stamps each step's
tokens as they arrive, so `prompt_tokens` and `generation_tokens` count exactly the tokens served.

Each app gets its own CollectorRegistry, so that tests can run several servers in one process.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PREFIX = "vllm:"
OWN_PREFIX = "pagoda:"  # Pagoda's own figures

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0]
REQUEST_BUCKETS = [0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                   40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]


class _SnapshotCollector:
    """Reads the engine client's latest EngineStats at scrape time."""

    def __init__(self, model_name: str, stats_source, cache_config: dict | None = None):
        self.model_name = model_name
        self.stats_source = stats_source
        self.cache_config = cache_config  # () -> the labels of vllm:cache_config_info

    def _gauge(self, name, doc, value, prefix=PREFIX):
        g = GaugeMetricFamily(prefix + name, doc, labels=["model_name"])
        g.add_metric([self.model_name], float(value))
        return g

    def _counter(self, name, doc, value):
        c = CounterMetricFamily(PREFIX + name, doc, labels=["model_name"])
        c.add_metric([self.model_name], float(value))
        return c

    def describe(self):
        return self.collect(empty=True)

    def collect(self, empty: bool = False):
        snap = {} if empty else self.stats_source()
        get = snap.get
        yield self._gauge("num_requests_running", "Requests in the running batch.", get("num_running", 0))
        yield self._gauge("num_requests_waiting", "Requests waiting to be scheduled.", get("num_waiting", 0))
        yield self._gauge("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0..1).",
                          get("kv_cache_usage", 0.0))
        yield self._gauge("kv_cache_capacity_tokens", "Tokens the KV cache of this replica holds.",
                          get("kv_capacity_tokens", 0), prefix=OWN_PREFIX)
        yield self._counter("num_preemptions", "Preempted requests (recomputed later).",
                            get("num_preemptions", 0))
        yield self._counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                            get("prefix_cache_queries", 0))
        yield self._counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                            get("prefix_cache_hits", 0))
        config = None if empty or self.cache_config is None else self.cache_config()
        if config:
            labels = sorted(config)
            info = GaugeMetricFamily(PREFIX + "cache_config_info", "Information of the KV cache config.",
                                     labels=labels)
            info.add_metric([str(config[k]) for k in labels], 1.0)
            yield info


class ServerMetrics:
    def __init__(self, model_name: str, stats_source, registry: CollectorRegistry | None = None,
                 cache_config=None):
        self.registry = registry or CollectorRegistry()
        self.model_name = model_name
        label = ["model_name"]
        r = self.registry
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens served.", label, registry=r)
        self.generation_tokens = Counter(PREFIX + "generation_tokens", "Generated tokens served.", label,
                                         registry=r)
        self.request_success = Counter(PREFIX + "request_success", "Finished requests, by finish reason.",
                                       label + ["finished_reason"], registry=r)
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds", "Time to first token.", label,
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram(PREFIX + "inter_token_latency_seconds", "Time between output steps.", label,
                             buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram(PREFIX + "e2e_request_latency_seconds", "Arrival to finish.", label,
                             buckets=REQUEST_BUCKETS, registry=r)
        self.queue_time = Histogram(PREFIX + "request_queue_time_seconds", "Arrival to first scheduled.",
                                    label, buckets=REQUEST_BUCKETS, registry=r)
        self.tpot = Histogram(PREFIX + "request_time_per_output_token_seconds",
                              "Mean time per output token after the first, per request.", label,
                              buckets=TPOT_BUCKETS, registry=r)
        self.prefill_time = Histogram(PREFIX + "request_prefill_time_seconds", "First scheduled to first token.",
                                      label, buckets=REQUEST_BUCKETS, registry=r)
        self.decode_time = Histogram(PREFIX + "request_decode_time_seconds", "First token to last token.",
                                     label, buckets=REQUEST_BUCKETS, registry=r)
        self.inference_time = Histogram(PREFIX + "request_inference_time_seconds", "First scheduled to finish.",
                                        label, buckets=REQUEST_BUCKETS, registry=r)
        token_buckets = _token_buckets(max_len=1 << 20)
        self.request_prompt_tokens = Histogram(PREFIX + "request_prompt_tokens", "Prompt tokens per request.",
                                               label, buckets=token_buckets, registry=r)
        self.request_generation_tokens = Histogram(PREFIX + "request_generation_tokens",
                                                   "Generated tokens per request.", label,
                                                   buckets=token_buckets, registry=r)
        r.register(_SnapshotCollector(model_name, stats_source, cache_config))
        # Label children are looked up once: .labels() costs a lock and a dict lookup per call.
        self._prompt_tokens = self.prompt_tokens.labels(model_name)
        self._generation_tokens = self.generation_tokens.labels(model_name)
        self._ttft = self.ttft.labels(model_name)
        self._itl = self.itl.labels(model_name)
        self._e2e = self.e2e.labels(model_name)
        self._queue_time = self.queue_time.labels(model_name)
        self._tpot = self.tpot.labels(model_name)
        self._prefill_time = self.prefill_time.labels(model_name)
        self._decode_time = self.decode_time.labels(model_name)
        self._inference_time = self.inference_time.labels(model_name)
        self._request_prompt_tokens = self.request_prompt_tokens.labels(model_name)
        self._request_generation_tokens = self.request_generation_tokens.labels(model_name)

    # ---- called by the OutputProcessor, on the event loop ----

    def on_first_token(self, num_prompt_tokens: int, ttft: float, queue_time: float) -> None:
        self._prompt_tokens.inc(num_prompt_tokens)
        self._ttft.observe(ttft)
        self._queue_time.observe(queue_time)

    def on_inter_token(self, itl: float) -> None:
        self._itl.observe(itl)

    def on_tokens(self, num_new: int) -> None:
        self._generation_tokens.inc(num_new)

    def on_finish(self, reason: str, e2e: float, num_prompt_tokens: int = 0, num_generation_tokens: int = 0,
                  first_scheduled: float | None = None, first_token: float | None = None,
                  last_token: float | None = None, finished: float | None = None) -> None:
        """One finished request; the times are its clock readings (monotonic seconds)."""
        self.request_success.labels(self.model_name, reason).inc()
        self._e2e.observe(e2e)
        self._request_prompt_tokens.observe(num_prompt_tokens)
        self._request_generation_tokens.observe(num_generation_tokens)
        if first_token is not None and last_token is not None:
            self._decode_time.observe(max(0.0, last_token - first_token))
            if num_generation_tokens > 1:
                self._tpot.observe(max(0.0, last_token - first_token) / (num_generation_tokens - 1))
        if first_scheduled is not None:
            if first_token is not None:
                self._prefill_time.observe(max(0.0, first_token - first_scheduled))
            if finished is not None:
                self._inference_time.observe(max(0.0, finished - first_scheduled))


def _token_buckets(max_len: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_len, as vLLM builds its token-count buckets."""
    buckets, exp = [], 0
    while True:
        for m in (1, 2, 5):
            value = m * 10**exp
            if value > max_len:
                return buckets
            buckets.append(value)
        exp += 1
