"""The two ceilings a roofline is drawn with, per GPU: bf16 matmul TFLOP/s and copy TB/s.

BENCHMARKS.md's rooflines use the H200's figures whatever card ran, because its targets are the
H200's; a run that landed elsewhere also gets a roofline drawn with its own card's ceilings, from
GPU_CEILINGS or, with --measure-ceilings, measured in the run as e2e/gpu_ceilings.py measures them.
torch is imported only to measure: the serving load generator reads the table where torch is absent.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from pagoda.runtime.tools.bench import results
from pagoda.runtime.tools.bench.roofline import H200_TB_PER_S, H200_TFLOP_PER_S


@dataclass(frozen=True, slots=True)
class GpuCeilings:
    gpu: str
    tflop_per_s: float  # bf16 8192^3 matmul
    tb_per_s: float  # device-to-device copy, bytes read plus bytes written
    source: str


# Keyed by torch.cuda.get_device_name() exactly (nvidia-smi reports the same names).
GPU_CEILINGS: dict[str, GpuCeilings] = {
    "NVIDIA H200": GpuCeilings("NVIDIA H200", H200_TFLOP_PER_S, H200_TB_PER_S, "BENCHMARKS.md, measured on the H200"),
    # H100 SXM, by e2e/gpu_ceilings.py on 2026-12-06 (FP8 _scaled_mm there: 1,379 TFLOP/s, 1.78x bf16)
    "NVIDIA H100 80GB HBM3": GpuCeilings("NVIDIA H100 80GB HBM3", 776.4, 3.03,
                                         "e2e/results/v-pairs-adb8df4/gpu-ceilings-NVIDIA-H100-80GB-HBM3.json"),
}

# Exact names only, no prefix matching: variants share prefixes but not ceilings ("NVIDIA H200 NVL"
# is a lower-power card; a MIG slice, "NVIDIA H100 80GB HBM3 MIG 1g.10gb", has a fraction of the
# bandwidth), so an unknown name gets no ceilings rather than another card's. Aliases cover the
# short names a person passes to `bench serve --gpu`.
ALIASES: dict[str, str] = {
    "H200": "NVIDIA H200",
    "H100": "NVIDIA H100 80GB HBM3",
}


def ceilings_for(gpu_name: str) -> GpuCeilings | None:
    """The table's ceilings for this device name (or an alias of one); None when it has none."""
    name = gpu_name.strip()
    return GPU_CEILINGS.get(ALIASES.get(name, name))


# The measurement of BENCHMARKS.md (and e2e/gpu_ceilings.py, which imports it from here).
MATMUL_N = 8192
COPY_GIB = 2.0
MEASURE_ITERS = 50
WARMUP_LAUNCHES = 3


def timed_ms(fn, iters: int) -> float:
    """Median of `iters` CUDA-event-timed launches of fn, after a warm-up."""
    import torch

    for _ in range(WARMUP_LAUNCHES):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def matmul_tflop_per_s(n: int, iters: int, device="cuda") -> float:
    import torch

    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    return 2 * n**3 / (timed_ms(lambda: a @ b, iters) * 1e-3) / 1e12


def copy_tb_per_s(gib: float, iters: int, device="cuda") -> float:
    """Device-to-device copy, counting each byte once read and once written."""
    import torch

    n = int(gib * 2**30)
    src = torch.empty(n, device=device, dtype=torch.uint8).random_(0, 255)
    dst = torch.empty_like(src)
    return 2 * n / (timed_ms(lambda: dst.copy_(src), iters) * 1e-3) / 1e12


def measure_ceilings(device="cuda", iters: int = MEASURE_ITERS) -> GpuCeilings:
    """This card's ceilings, measured now. The 4 GiB of copy buffers go back to the driver after,
    so an engine started next plans its KV cache as if nothing had run."""
    import torch

    device = torch.device(device)
    with torch.cuda.device(device):
        ceilings = GpuCeilings(
            gpu=torch.cuda.get_device_name(device),
            tflop_per_s=matmul_tflop_per_s(MATMUL_N, iters, device),
            tb_per_s=copy_tb_per_s(COPY_GIB, iters, device),
            source="measured in this run",
        )
        torch.cuda.empty_cache()
    return ceilings


def add_argument(p) -> None:
    p.add_argument("--measure-ceilings", action="store_true",
                   help="measure this card's matmul and copy ceilings before the run, for the this-GPU "
                        "roofline, instead of taking them from ceilings.GPU_CEILINGS")


def measured_before_run(args) -> GpuCeilings | None:
    """--measure-ceilings on CUDA: measured before the engine starts, while its memory is free."""
    if not args.measure_ceilings:
        return None
    import torch

    device = getattr(args, "device", "auto")
    if device == "cpu" or not torch.cuda.is_available():
        print("--measure-ceilings: no CUDA device in this run, nothing measured")
        return None
    return measure_ceilings(device if device.startswith("cuda") else "cuda")


def this_gpu(args, measured: GpuCeilings | None) -> GpuCeilings | None:
    """The ceilings of the card that ran: measured, else the table's for the record's "gpu" name;
    None on CPU runs and unknown cards."""
    if measured is not None:
        return measured
    if getattr(args, "device", "auto") == "cpu":
        return None  # a CPU run on a machine with a GPU: that GPU's ceilings are not this run's
    return ceilings_for(results.gpu_name())
