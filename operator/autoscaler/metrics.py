"""The runtime's queue gauges that every scaling mode reads: one place, so that a rename of the
runtime's metrics (say to vLLM's `vllm:` names) is a one-line change here."""

from __future__ import annotations

PREFIX = "vllm:"
WAITING = f"{PREFIX}num_requests_waiting"
RUNNING = f"{PREFIX}num_requests_running"
# The custom-metrics API (prometheus-adapter, for the HPA) cannot carry a colon in a name.
HPA_WAITING = WAITING.replace(":", "_")
