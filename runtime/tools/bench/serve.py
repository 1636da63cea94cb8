"""`pagoda bench serve`: the online-serving benchmark (W3) against any OpenAI-compatible server.

It sweeps request rates (a Poisson process per rate, or `inf` = everything at once), prints a
table, and writes one JSON (one entry per rate) and a PNG of latency against rate. With the W1
offline figure (`--offline-result` or `--offline-tokens-per-s`) it also reports the served to
offline throughput ratio at full load, and checks W3's targets.
"""

from __future__ import annotations

import asyncio
import json
import math
import time

import httpx

from pagoda.runtime.tools.bench import server_metrics, workloads
from pagoda.runtime.tools.bench.ceilings import ceilings_for
from pagoda.runtime.tools.bench.results import command_line, gpu_name, write_result
from pagoda.runtime.tools.bench.roofline import serving_tpot_roofline_ms
from pagoda.runtime.tools.bench.serve_client import run_load, summarize

# W3's targets (BENCHMARKS.md).
TARGET_RATIO = 0.90
TARGET_RATE = 16.0
TARGET_TTFT_P99_MS = 250.0
TARGET_TPOT_P99_MS = 30.0


def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    lo_i, hi_i = int(lo), int(hi or lo)
    if not 1 <= lo_i <= hi_i:
        raise ValueError(f"bad length range {text!r}: want LO:HI with 1 <= LO <= HI")
    return lo_i, hi_i


def add_arguments(p) -> None:
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (a trailing /v1 is fine)")
    p.add_argument("--endpoint", default="/v1/completions")
    p.add_argument("--model", default=None, help="model name to request (default: the first of /v1/models)")
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    p.add_argument("--request-rate", nargs="+", default=list(workloads.W3_REQUEST_RATES),
                   help="requests/s; several values sweep; 'inf' sends everything at once")
    p.add_argument("--max-concurrency", type=int, default=None, help="cap on requests in flight")
    p.add_argument("--num-prompts", type=int, default=workloads.W3_NUM_REQUESTS)
    p.add_argument("--input-len", type=_range, default=workloads.PROMPT_LEN_RANGE, metavar="LO:HI")
    p.add_argument("--output-len", type=_range, default=workloads.W3_OUTPUT_LEN_RANGE, metavar="LO:HI")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup-prompts", type=int, default=32,
                   help="requests sent all at once (another draw, 16 output tokens) before the sweep and "
                        "left out of it, so first-use costs (kernel compiles, allocations) stay out of it")
    p.add_argument("--prompt-format", default="auto", choices=["auto", "ids", "text"],
                   help="ids = token-id prompts; text = detokenized with --tokenizer; auto = ids if accepted")
    p.add_argument("--tokenizer", default=None, help="for text prompts: a tokenizer folder or w1/w4")
    p.add_argument("--wait-for-server", type=float, default=0.0, metavar="SECONDS",
                   help="poll /v1/models until the server answers, up to this long")
    p.add_argument("--timeout", type=float, default=1800.0, help="per-request timeout, seconds")
    p.add_argument("--offline-result", default=None, help="a W1 result JSON, for the served/offline ratio")
    p.add_argument("--offline-tokens-per-s", type=float, default=None)
    p.add_argument("--backend-name", default="pagoda", help="the 'backend' key of the result (the server)")
    p.add_argument("--gpu", default=None, help="the server's GPU, when it is not this machine's")
    p.add_argument("--roofline-model", default="w1", choices=["none", *workloads.MODEL_CONFIGS],
                   help="the served model's shape, for each rate's TPOT roofline on the server's GPU "
                        "(default w1, the model W3 serves; none: no roofline)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--out", default=None, help="result folder (default e2e/results)")


def _root(base_url: str) -> str:
    base = base_url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def _headers(api_key: str | None) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def wait_for_server(root: str, headers: dict, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if httpx.get(f"{root}/v1/models", headers=headers, timeout=5, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"no answer from {root}/v1/models within {seconds:.0f} s")
        time.sleep(1.0)


def first_model(root: str, headers: dict) -> str:
    resp = httpx.get(f"{root}/v1/models", headers=headers, timeout=30, trust_env=False)
    resp.raise_for_status()
    return resp.json()["data"][0]["id"]


def accepts_token_ids(url: str, model: str, headers: dict, prompt: list[int]) -> bool:
    """Whether the server takes a list of ints as `prompt` (vLLM and Pagoda do; many do not)."""
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0}
    resp = httpx.post(url, json=body, headers=headers, timeout=120, trust_env=False)
    if resp.status_code == 200:
        return True
    if 400 <= resp.status_code < 500:
        return False
    resp.raise_for_status()
    return False


def build_prompts(args, requests, url: str, model: str, headers: dict, fmt: str | None = None) -> tuple[list, str]:
    fmt = fmt or args.prompt_format
    if fmt == "auto":
        fmt = "ids" if accepts_token_ids(url, model, headers, requests[0].prompt_token_ids) else "text"
    if fmt == "ids":
        return [r.prompt_token_ids for r in requests], fmt
    from transformers import AutoTokenizer

    if not args.tokenizer:
        raise SystemExit("the server takes no token-id prompts; pass --tokenizer to send text")
    tokenizer = AutoTokenizer.from_pretrained(workloads.resolve_model(args.tokenizer))
    return [tokenizer.decode(r.prompt_token_ids) for r in requests], fmt


def _offline_figure(args) -> float | None:
    if args.offline_tokens_per_s is not None:
        return args.offline_tokens_per_s
    if args.offline_result:
        with open(args.offline_result) as f:
            return float(json.load(f)["output_tokens_per_s"])
    return None


def check_targets(rates: list[dict], ratio: float | None) -> dict:
    at_target = next((r for r in rates if r["request_rate"] == TARGET_RATE), None)
    checks = {"no_failures": all(r["failed"] == 0 for r in rates)}
    if ratio is not None:
        checks["full_load_ratio_ge_0.90"] = ratio >= TARGET_RATIO
    if at_target is not None and at_target["completed"]:
        checks["ttft_p99_lt_250ms_at_16"] = at_target["ttft_ms_p99"] < TARGET_TTFT_P99_MS
        checks["tpot_p99_lt_30ms_at_16"] = at_target["tpot_ms_p99"] < TARGET_TPOT_P99_MS
    return checks


def rate_label(rate) -> str:
    return rate if isinstance(rate, str) else f"{rate:g}"


def print_table(rates: list[dict]) -> None:
    cols = [("rate", "request_rate", None), ("ok", "completed", "{}"), ("fail", "failed", "{}"),
            ("req/s", "request_throughput", "{:.2f}"), ("out tok/s", "output_tokens_per_s", "{:,.0f}"),
            ("TTFT p50", "ttft_ms_p50", "{:.1f}"), ("p90", "ttft_ms_p90", "{:.1f}"), ("p99", "ttft_ms_p99", "{:.1f}"),
            ("TPOT p50", "tpot_ms_p50", "{:.2f}"), ("p90", "tpot_ms_p90", "{:.2f}"), ("p99", "tpot_ms_p99", "{:.2f}"),
            ("ITL p99", "itl_ms_p99", "{:.2f}"), ("E2E p50", "e2e_ms_p50", "{:.0f}"), ("p99", "e2e_ms_p99", "{:.0f}")]
    rows = [[h for h, _, _ in cols]]
    for r in rates:
        rows.append([rate_label(r[k]) if fmt is None else ("-" if r[k] is None else fmt.format(r[k]))
                     for _, k, fmt in cols])
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    print("latencies in ms")
    for row in rows:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths)))


# Seeds of the other request sets, far from the measured set's so that no two share a prompt.
WARMUP_SEED_OFFSET = 1_000_003
RATE_SEED_STRIDE = 7_919


def run(args) -> int:
    root = _root(args.base_url)
    headers = _headers(args.api_key)
    if args.wait_for_server:
        wait_for_server(root, headers, args.wait_for_server)
    model = args.model or first_model(root, headers)
    url = root + args.endpoint
    requests = workloads.serving_requests(args.num_prompts, args.seed, args.input_len, args.output_len)
    prompts, prompt_format = build_prompts(args, requests, url, model, headers)
    if args.warmup_prompts:
        warm = workloads.serving_requests(args.warmup_prompts, args.seed + WARMUP_SEED_OFFSET, args.input_len, (16, 16))
        warm_prompts, _ = build_prompts(args, warm, url, model, headers, prompt_format)
        results, _ = asyncio.run(run_load(url, warm, warm_prompts, model, float("inf"), args.max_concurrency,
                                          headers, args.seed, args.timeout, progress=False))
        failed = sum(not r.success for r in results)
        print(f"warm-up: {len(results) - failed} of {len(results)} requests ok")
    rates = []
    for index, rate_text in enumerate(args.request_rate):
        rate = float(rate_text)
        if index:
            # Fresh prompts for every rate after the first: the server's prefix cache still holds
            # the earlier rates' prompts, and re-sending them would skip their prefill.
            requests = workloads.serving_requests(
                args.num_prompts, args.seed + index * RATE_SEED_STRIDE, args.input_len, args.output_len
            )
            prompts, _ = build_prompts(args, requests, url, model, headers, prompt_format)
        before = server_metrics.scrape(root, headers)
        results, duration = asyncio.run(run_load(
            url, requests, prompts, model, rate, args.max_concurrency, headers, args.seed,
            args.timeout, progress=not args.no_progress))
        summary = summarize(results, duration, rate)
        # the server's split of this rate's TTFT: queue (scheduler) and prefill (its steps)
        summary["server_side"] = server_metrics.delta(before, server_metrics.scrape(root, headers))
        rates.append(summary)
        print(f"rate {rate_text}: {summary['completed']} ok, {summary['failed']} failed, "
              f"{summary['output_tokens_per_s']:,.0f} out tok/s, TTFT p99 {summary['ttft_ms_p99'] or 0:.1f} ms, "
              f"TPOT p99 {summary['tpot_ms_p99'] or 0:.2f} ms")
        for error, count in list(summary["errors"].items())[:5]:
            print(f"  {count} x {error}")
        side = summary["server_side"] or {}
        if side.get("queue") and side.get("prefill"):
            print(f"  server side: queue {side['queue']['mean_ms'] or 0:.1f} ms, prefill "
                  f"{side['prefill']['mean_ms'] or 0:.1f} ms mean over {side['queue']['count']} requests")
        for slow in summary["ttft_slowest"][:3]:  # the TTFT tail: a burst before it, or a stall?
            print(f"  slow first token: {slow['ttft_ms']:.1f} ms, sent at {slow['sent_s']:.2f} s with "
                  f"{slow['in_flight_at_send']} in flight and {slow['prompt_tokens_in_window_before']} prompt "
                  f"tokens sent in the second before")
    print_table(rates)
    offline = _offline_figure(args)
    full_load = max(rates, key=lambda r: math.inf if r["request_rate"] == "inf" else r["request_rate"])
    ratio = full_load["output_tokens_per_s"] / offline if offline else None
    record = {
        "workload": "W3",
        "backend": args.backend_name,
        "command": command_line(args),
        "base_url": args.base_url,
        "model": model,
        "num_prompts": args.num_prompts,
        "input_len": list(args.input_len),
        "output_len": list(args.output_len),
        "seed": args.seed,
        "max_concurrency": args.max_concurrency,
        "prompt_format": prompt_format,
        "rates": rates,
        "offline_output_tokens_per_s": offline,
        "offline_result": args.offline_result,
        "full_load_request_rate": full_load["request_rate"],
        "served_to_offline_ratio": ratio,
        "targets": check_targets(rates, ratio),
    }
    if args.gpu:
        record["gpu"] = args.gpu
    add_tpot_rooflines(rates, args.roofline_model, args.gpu or gpu_name())
    if ratio is not None:
        print(f"served/offline at full load: {ratio:.1%} ({full_load['output_tokens_per_s']:,.0f} / {offline:,.0f} tok/s)")
    print("targets: " + ", ".join(f"{k}={'pass' if v else 'MISS'}" for k, v in record["targets"].items()))
    write_result(record, args.out, plot=plot_serve)
    return 0 if all(r["failed"] == 0 for r in rates) else 1


def add_tpot_rooflines(rates: list[dict], model: str, gpu: str) -> None:
    """Each rate's TPOT roofline (roofline.serving_tpot_roofline_ms) on the server's GPU, with the
    ceilings the table has for it; nothing for an unknown GPU or --roofline-model none."""
    card = ceilings_for(gpu)
    if model == "none" or card is None:
        return
    for rate in rates:
        if not rate["completed"]:
            continue
        roof = serving_tpot_roofline_ms(workloads.MODEL_CONFIGS[model], rate, card.tflop_per_s, card.tb_per_s)
        label = rate_label(rate["request_rate"])
        if roof["prefill_saturates"]:
            roof["tpot_roofline_ms"] = None  # infinite, and JSON has no infinity
            print(f"rate {label}: prefill alone needs {roof['prefill_share']:.0%} of {card.gpu}'s matmul "
                  f"ceiling: no TPOT roofline")
        bound, p50 = roof["tpot_roofline_ms"], rate["tpot_ms_p50"]
        rate["tpot_roofline"] = roof | {"model": model, "gpu": card.gpu, "source": card.source}
        rate["tpot_roofline_ms"] = bound
        rate["tpot_p50_to_roofline"] = p50 / bound if bound and p50 is not None else None
        if rate["tpot_p50_to_roofline"] is not None:
            print(f"rate {label}: TPOT roofline on {card.gpu} {bound:.2f} ms, p50 at "
                  f"{rate['tpot_p50_to_roofline']:.2f}x")


def plot_serve(record: dict, png_path) -> None:
    import matplotlib.pyplot as plt

    rates = record["rates"]
    labels = [rate_label(r["request_rate"]) for r in rates]
    x = range(len(rates))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    panels = [("ttft", "TTFT (ms)", TARGET_TTFT_P99_MS), ("tpot", "TPOT (ms)", TARGET_TPOT_P99_MS),
              ("e2e", "end-to-end latency (ms)", None)]
    for ax, (key, title, target) in zip(axes, panels):
        for q, style in (("p50", "o-"), ("p90", "s--"), ("p99", "^-")):
            ys = [r[f"{key}_ms_{q}"] if r[f"{key}_ms_{q}"] is not None else float("nan") for r in rates]
            ax.plot(x, ys, style, label=q)
        if target is not None:
            ax.axhline(target, color="tab:red", ls=":", lw=1, label=f"p99 target at {TARGET_RATE:g} req/s")
        ax.set_xticks(list(x), labels)
        ax.set_xlabel("request rate (req/s)")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    tput = ", ".join(f"{rate_label(r['request_rate'])}: {r['output_tokens_per_s']:,.0f}" for r in rates)
    ratio = record.get("served_to_offline_ratio")
    fig.suptitle(f"W3 serving on {record['gpu']} ({record['backend']}, {record['num_prompts']} requests per rate)\n"
                 f"output tok/s by rate - {tput}" + (f"; full load / offline = {ratio:.1%}" if ratio else ""),
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
