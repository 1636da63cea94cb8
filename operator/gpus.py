"""Memory per GPU, for the loader's fit check (`pagoda plan --gpu-memory-gib`).

Keys are the `nvidia.com/gpu.product` node labels that GPU feature discovery writes, matched by
substring so that board variants (-SXM, -PCIE, -HBM3) resolve. `resources.gpuMemoryGiB` overrides the
table for anything missing here.
"""

from __future__ import annotations

import re

# Ordered: the first matching entry wins, so the specific names come before the generic ones.
GPU_MEMORY_GIB: tuple[tuple[str, float], ...] = (
    ("H200", 141),
    ("GH200", 96),
    ("H100-NVL", 94),
    ("H100", 80),
    ("H800", 80),
    ("A100-SXM4-40GB", 40),
    ("A100-PCIE-40GB", 40),
    ("A100", 80),
    ("L40S", 48),
    ("L40", 48),
    ("L4", 24),
    ("A10G", 24),
    ("A10", 24),
    ("RTX-4090", 24),
    ("RTX-6000", 48),
    ("T4", 16),
    ("V100-SXM2-32GB", 32),
    ("V100", 16),
    ("B200", 180),
    ("MI300X", 192),
)

# When neither gpuType nor gpuMemoryGiB says: the common 80 GB class; the status says it was assumed.
DEFAULT_GPU_MEMORY_GIB = 80.0

_QUANTITY = re.compile(r"^([0-9.]+)([KMGTPE]i?|[numk]?)$")
_FACTORS = {
    "": 1,
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "k": 1e3,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def gpu_memory_gib(gpu_type: str | None, override: float | None = None) -> tuple[float, bool]:
    """(GiB per GPU, whether it was assumed rather than known)."""
    if override:
        return float(override), False
    if gpu_type:
        upper = gpu_type.upper()
        for key, gib in GPU_MEMORY_GIB:
            if key in upper:
                return float(gib), False
    return DEFAULT_GPU_MEMORY_GIB, True


def quantity_gib(quantity: str) -> float:
    """A Kubernetes memory quantity ("32Gi", "64G", "1.5Ti") in GiB."""
    m = _QUANTITY.match(quantity.strip())
    if not m:
        raise ValueError(f"not a memory quantity: {quantity!r}")
    return float(m[1]) * _FACTORS[m[2]] / 2**30
