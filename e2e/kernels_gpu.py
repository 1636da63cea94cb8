"""Pagoda's Triton kernels on the GPU: each against its torch reference, then microbenchmarks.

Run on the H200 from the repository root:
    python e2e/kernels_gpu.py [--out DIR] [--quick] [--sweep] [--skip-bench] [--decode-rules]

Correctness first: every kernel on fresh random inputs against its reference (paged attention
with unowned cache slots poisoned by NaN), and the launch paths the runtime uses are run under
torch.cuda.set_sync_debug_mode("error") to prove they never wait on the host. Any mismatch is
printed and the script exits 1 before benchmarking. Then the microbenchmarks: paged decode
TB/s over batch 64..256 x context 512..8k (target 80% of 4.25 TB/s), prefill TFLOP/s at 4k
(target 50% of 780), and the bandwidth of the elementwise kernels and the sampler. One JSON per
kernel goes to --out (default $OUT, else e2e/results/), and a table is printed at the end.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ.get("OUT") or ROOT / "e2e" / "results"),
        help="directory for the JSON results (default: $OUT, else e2e/results)",
    )
    p.add_argument("--block-size", type=int, default=16, help="KV-cache block size for the benchmarks")
    p.add_argument("--quick", action="store_true", help="a 2x2 corner of the decode grid only")
    p.add_argument("--sweep", action="store_true", help="also sweep the decode and prefill launch knobs")
    p.add_argument("--skip-bench", action="store_true", help="correctness only")
    p.add_argument("--decode-rules", action="store_true",
                   help="only the decode launch-rule comparison (after the checks), into paged_attention_decode-rules")
    p.add_argument("--skip-check", action="store_true", help="benchmarks only (not for published figures)")
    return p.parse_args(argv)


def run_metadata() -> dict:
    import torch
    import triton

    def git(*a):
        try:
            return subprocess.run(
                ["git", *a], cwd=ROOT, capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "unknown"

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return dict(
        backend="pagoda",
        gpu=torch.cuda.get_device_name(),
        # The GPU machine gets a copy of the tree without .git: the caller names the commit there.
        commit=os.environ.get("PAGODA_COMMIT") or git("rev-parse", "HEAD") + ("-dirty" if dirty else ""),
        torch=torch.__version__,
        triton=triton.__version__,
        command=" ".join([Path(sys.executable).name, *sys.argv]),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )


def write_result(out_dir: Path, workload: str, meta: dict, body: dict) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{workload}-pagoda-{meta['date'][:10]}.json"
    path.write_text(json.dumps(dict(workload=workload, **meta, **body), indent=2) + "\n")
    return path


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("kernels_gpu.py needs a CUDA GPU", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import kernels_gpu_bench as bench
    from kernels_gpu_checks import run_checks

    device = torch.device("cuda")
    meta = run_metadata()
    print(f"{meta['gpu']}  torch {meta['torch']}  triton {meta['triton']}  commit {meta['commit']}")
    written = []
    if not args.skip_check:
        checks = run_checks(device)
        failed = [c for c in checks if not c["ok"]]
        written.append(
            write_result(
                args.out,
                "kernels-correctness",
                meta,
                dict(passed=len(checks) - len(failed), failed=len(failed), checks=checks),
            )
        )
        for c in failed:
            print(f"MISMATCH {c['kernel']} {c['case']}: {c.get('error', '')}", file=sys.stderr)
        print(f"correctness: {len(checks) - len(failed)}/{len(checks)} checks passed")
        if failed:
            print("FAILED: kernels disagree with their references; no benchmarks run", file=sys.stderr)
            return 1
    if args.skip_bench:
        return 0

    if args.decode_rules:
        body = bench.sweep_decode_rules(device, args.block_size)
        written.append(write_result(args.out, "paged_attention_decode-rules", meta, body))
        print("\nresults: " + ", ".join(str(p) for p in written))
        return 0

    table = []  # (kernel, figure, ceiling fraction, target)
    decode = bench.bench_decode(device, args.block_size, args.quick)
    body = dict(
        achieved_tb_per_s=bench.summary_of(decode, "achieved_tb_per_s"),
        figure="worst point of the grid",
        peak_tb_per_s=bench.PEAK_TB_PER_S,
        target_fraction=0.8,
        heads=bench.HEADS,
        kv_heads=bench.KV_HEADS,
        head_dim=bench.HEAD_DIM,
        dtype="bfloat16",
        points=decode,
    )
    if args.sweep:
        body["sweep"] = bench.sweep_decode(device, args.block_size)
    body["fraction_of_peak"] = round(body["achieved_tb_per_s"] / bench.PEAK_TB_PER_S, 3)
    body["meets_target"] = body["fraction_of_peak"] >= 0.8
    written.append(write_result(args.out, "paged_attention_decode", meta, body))
    table.append(
        (
            "paged_attention_decode (worst point)",
            f"{body['achieved_tb_per_s']:.2f} TB/s",
            body["fraction_of_peak"],
            "0.80",
        )
    )
    for p in decode:
        table.append(
            (
                f"  decode batch {p['batch']} ctx {p['context']} splits {p['num_splits']}",
                f"{p['achieved_tb_per_s']:.2f} TB/s ({p['ms']:.3f} ms)",
                p["fraction_of_peak"],
                "0.80",
            )
        )

    prefill, peer = bench.bench_prefill(device, args.block_size)
    headline = prefill[0]["achieved_tflop_per_s"]
    body = dict(
        achieved_tflop_per_s=headline,
        figure="4 fresh prompts of 4096 tokens",
        peak_tflop_per_s=bench.PEAK_TFLOP_PER_S,
        target_fraction=0.5,
        fraction_of_peak=round(headline / bench.PEAK_TFLOP_PER_S, 3),
        meets_target=headline / bench.PEAK_TFLOP_PER_S >= 0.5,
        points=prefill,
        torch_sdpa_peer=peer,
    )
    if args.sweep:
        body["sweep"] = bench.sweep_prefill(device, args.block_size)
    written.append(write_result(args.out, "paged_attention_prefill", meta, body))
    for p in prefill:
        table.append(
            (
                f"paged_attention_prefill q {p['q_lens'][0]}x{len(p['q_lens'])} ctx {p['seq_lens'][0]}",
                f"{p['achieved_tflop_per_s']:.1f} TFLOP/s ({p['ms']:.3f} ms)",
                p["fraction_of_peak"],
                "0.50" if p is prefill[0] else "-",
            )
        )
    if peer:
        table.append(
            (
                "  torch sdpa, same shape",
                f"{peer['achieved_tflop_per_s']:.1f} TFLOP/s",
                round(peer["achieved_tflop_per_s"] / bench.PEAK_TFLOP_PER_S, 3),
                "-",
            )
        )

    groups = bench.bench_elementwise(device)
    groups["sampling"] = bench.bench_sampling(device)
    for name, points in groups.items():
        best = max(p["achieved_tb_per_s"] for p in points)
        written.append(
            write_result(
                args.out,
                name,
                meta,
                dict(
                    achieved_tb_per_s=best,
                    figure="best variant",
                    peak_tb_per_s=bench.PEAK_TB_PER_S,
                    fraction_of_peak=round(best / bench.PEAK_TB_PER_S, 3),
                    points=points,
                ),
            )
        )
        for p in points:
            variant = ", ".join(
                f"{k}={v}" for k, v in p.items() if k in ("residual", "inplace", "need_cutoffs")
            )
            table.append(
                (
                    f"{name} {variant}".strip(),
                    f"{p['achieved_tb_per_s']:.2f} TB/s ({p['ms']:.3f} ms)",
                    p["fraction_of_peak"],
                    "-",
                )
            )

    print(f"\n{'kernel':44s} {'achieved':26s} {'of peak':>8s} {'target':>7s}")
    for name, figure, frac, target in table:
        print(f"{name:44s} {figure:26s} {frac:8.2f} {target:>7s}")
    print("\nresults: " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
