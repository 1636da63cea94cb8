"""One table and one plot of W3 for Pagoda and vLLM from the same call (e2e/run_w3_peer.sh).

    python3 e2e/w3_compare.py OUT_DIR [--pagoda FILE ...] [--vllm FILE ...]

Defaults: every W3-pagoda-*.json and W3-vllm-*.json in OUT_DIR; files holding different rates of one
sweep (run_w3_same_call.sh writes one per rate) are merged. With several runs per server
(W3_REPEAT, or one rate given several times), each run is a row, and each Pagoda run is checked against
the vLLM run on the same prompts (the same seed; else vLLM's run of the same index, else its first).
The issue's targets at 16 req/s, run by run: Pagoda's TPOT p50 at most 0.85x vLLM's, its TPOT p99 and TTFT p99 at most
vLLM's; at every rate its output throughput at least vLLM's. Writes W3-compare-<commit>.json and
.png into OUT_DIR.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

KEYS = ("output_tokens_per_s", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99", "failed")
# Only in results of `bench serve` that knew the server's GPU's ceilings; a column when any run has it.
ROOFLINE_KEYS = ("tpot_roofline_ms",)


def _load(paths) -> list[dict]:
    return group_runs([json.loads(Path(p).read_text()) for p in sorted(paths)])


def group_runs(records: list[dict]) -> list[dict]:
    """Files that each hold some of the rates (run_w3_same_call.sh writes one per rate) merged into
    runs: a file joins the first run that lacks all of its rates, so repeats become runs 2, 3..."""
    runs: list[dict] = []
    for record in records:
        rates = {rate_key(r["request_rate"]) for r in record["rates"]}
        for run in runs:
            if not rates & {rate_key(r["request_rate"]) for r in run["rates"]}:
                run["rates"] = run["rates"] + record["rates"]
                break
        else:
            runs.append(dict(record, rates=list(record["rates"])))
    return runs


def rate_key(rate) -> str:
    """'16' for 16 or 16.0 (the JSON may hold either), 'inf' for all at once."""
    return "inf" if rate in ("inf", float("inf")) else f"{float(rate):g}"


def by_rate(record: dict) -> dict[str, dict]:
    """Rate -> figures, in the sweep's order (ascending, all-at-once last) whatever the files' order."""
    rates = {rate_key(r["request_rate"]): {k: r.get(k) for k in KEYS} | {k: r[k] for k in ROOFLINE_KEYS if k in r}
             for r in record["rates"]}
    return dict(sorted(rates.items(), key=lambda item: float(item[0])))


def peer_run(pagoda_run: dict, index: int, vllms: list[dict]) -> dict:
    """The vLLM run that saw the same prompts as this Pagoda run."""
    same_seed = [v for v in vllms if v.get("seed") is not None and v.get("seed") == pagoda_run.get("seed")]
    if same_seed:
        return same_seed[0]
    return vllms[index] if index < len(vllms) else vllms[0]


def targets(pagoda: list[dict], vllms: list[dict]) -> dict:
    out = {}
    for i, run in enumerate(pagoda):
        p, v = by_rate(run), by_rate(peer_run(run, i, vllms))
        if "16" in p and "16" in v:
            out[f"run{i + 1}_tpot_p50_le_0.85x"] = p["16"]["tpot_ms_p50"] <= 0.85 * v["16"]["tpot_ms_p50"]
            out[f"run{i + 1}_tpot_p99_le_vllm"] = p["16"]["tpot_ms_p99"] <= v["16"]["tpot_ms_p99"]
            out[f"run{i + 1}_ttft_p99_le_vllm"] = p["16"]["ttft_ms_p99"] <= v["16"]["ttft_ms_p99"]
        out[f"run{i + 1}_throughput_ge_vllm_every_rate"] = all(
            p[r]["output_tokens_per_s"] >= v[r]["output_tokens_per_s"] for r in p if r in v)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--pagoda", nargs="*", default=None)
    ap.add_argument("--vllm", nargs="*", default=None)
    args = ap.parse_args()
    out = Path(args.out)
    pagoda = _load(args.pagoda if args.pagoda is not None else out.glob("W3-pagoda-*.json"))
    vllms = _load(args.vllm if args.vllm is not None else out.glob("W3-vllm-*.json"))
    if not pagoda or not vllms:
        raise SystemExit("need at least one W3-pagoda and one W3-vllm result")
    vllm = vllms[0]
    rows = [("vllm", i + 1, by_rate(r)) for i, r in enumerate(vllms)] + [("pagoda", i + 1, by_rate(r))
                                                                       for i, r in enumerate(pagoda)]
    columns = KEYS + tuple(k for k in ROOFLINE_KEYS if any(k in fig for *_, rates in rows for fig in rates.values()))
    print(f"{'server':8} {'run':>3} {'rate':>5} " + " ".join(f"{k:>19}" for k in columns))
    for name, run, rates in rows:
        for rate, fig in rates.items():
            print(f"{name:8} {run:>3} {rate:>5} " + " ".join(
                f"{(fig[k] if fig.get(k) is not None else float('nan')):>19.2f}" for k in columns))
    commit = os.environ.get("PAGODA_COMMIT") or pagoda[-1].get("commit", "unknown")
    record = {"workload": "W3-compare", "commit": commit, "gpu": pagoda[-1].get("gpu"),
              "vllm": by_rate(vllm), "vllm_runs": [by_rate(r) for r in vllms],
              "pagoda_runs": [by_rate(r) for r in pagoda], "seeds": [r.get("seed") for r in pagoda],
              "targets": targets(pagoda, vllms)}
    print("targets: " + ", ".join(f"{k}={'pass' if v else 'MISS'}" for k, v in record["targets"].items()))
    (out / f"W3-compare-{commit}.json").write_text(json.dumps(record, indent=1) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return 0
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, (key, title) in zip(axes, [("ttft", "TTFT (ms)"), ("tpot", "TPOT (ms)"), ("output", "output tok/s")]):
        for name, run, rates in rows:
            labels = list(rates)
            style = dict(color="tab:orange" if name == "vllm" else "tab:blue", alpha=1.0 if run == 1 else 0.5)
            if key == "output":
                ax.plot(labels, [rates[r]["output_tokens_per_s"] for r in labels], "o-", label=f"{name} {run}", **style)
            else:
                ax.plot(labels, [rates[r][f"{key}_ms_p50"] for r in labels], "o-", label=f"{name} {run} p50", **style)
                ax.plot(labels, [rates[r][f"{key}_ms_p99"] for r in labels], "s--", label=f"{name} {run} p99", **style)
        ax.set_title(title)
        ax.set_xlabel("request rate (req/s)")
        ax.set_yscale("log" if key == "ttft" else "linear")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"W3 on {record['gpu']}: Pagoda {commit} vs vLLM {vllm.get('vllm', '0.26')}, same call")
    fig.tight_layout()
    fig.savefig(out / f"W3-compare-{commit}.png", dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
