"""The server's own view of a load run: its request-phase histograms from /metrics, before and after.

The client's TTFT covers queueing, prefill and the HTTP path together. Pagoda and vLLM both export
`vllm:request_queue_time_seconds` (arrival to first scheduled) and
`vllm:request_prefill_time_seconds` (first scheduled to first token), so the difference of two
scrapes splits a rate's TTFT into the two on either server: a long queue says the scheduler held
requests back, a long prefill that the steps carrying them ran long. Bucket edges are each server's
own, so the means are what compares across servers; the buckets say how the tail falls.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

PHASES = {"queue": "vllm:request_queue_time_seconds", "prefill": "vllm:request_prefill_time_seconds",
          "ttft": "vllm:time_to_first_token_seconds"}


def parse(text: str) -> dict:
    """{phase: {"sum": s, "count": n, "buckets": {le: cumulative count}}}, summed over label sets,
    for the PHASES the text has."""
    out: dict = {}
    names = {name.split(":", 1)[1]: phase for phase, name in PHASES.items()}
    for family in text_string_to_metric_families(text):
        # matched without the prefix: the same histogram whatever namespace a server gives it
        phase = names.get(family.name.split(":", 1)[-1])
        if phase is None or family.type != "histogram":
            continue
        entry = out.setdefault(phase, {"sum": 0.0, "count": 0.0, "buckets": {}})
        for sample in family.samples:
            if sample.name.endswith("_sum"):
                entry["sum"] += sample.value
            elif sample.name.endswith("_count"):
                entry["count"] += sample.value
            elif sample.name.endswith("_bucket"):
                le = sample.labels["le"]
                entry["buckets"][le] = entry["buckets"].get(le, 0.0) + sample.value
    return out


def scrape(root: str, headers: dict, timeout_s: float = 10.0) -> dict | None:
    """parse() of root/metrics, or None where the server has none (a run goes on without it)."""
    try:
        resp = httpx.get(f"{root}/metrics", headers=headers, timeout=timeout_s, trust_env=False)
    except httpx.HTTPError:
        return None
    return parse(resp.text) if resp.status_code == 200 else None


def delta(before: dict | None, after: dict | None) -> dict | None:
    """What the run between two scrapes added: per phase its count, mean in ms and cumulative
    bucket counts (by upper edge in seconds)."""
    if before is None or after is None:
        return None
    out = {}
    for phase, now in after.items():
        then = before.get(phase, {"sum": 0.0, "count": 0.0, "buckets": {}})
        count = now["count"] - then["count"]
        buckets = {le: int(round(v - then["buckets"].get(le, 0.0))) for le, v in now["buckets"].items()}
        out[phase] = {"count": int(round(count)),
                      "mean_ms": (now["sum"] - then["sum"]) / count * 1e3 if count > 0 else None,
                      "buckets": buckets}
    return out
