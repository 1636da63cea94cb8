"""The runtime's one-row FP8 GEMV launches (kernels/fp8_dispatch.FP8_SMALL_M, and the qkv entry's rope
fold) compiled for sm_90 here, with the ptxas and cuobjdump that Triton ships (e2e/sm90_asm.py): none
spills registers to local memory, and each streams its weights with 16-byte loads. A table entry
that breaks either would cost bandwidth on the H200 that no CPU test of the results would show."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_launches_compile_without_spills_and_with_wide_loads():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(ROOT / "e2e" / "sm90_asm.py")], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stdout.splitlines() if " regs " in line]
    assert len(lines) >= 6, out.stdout  # every 1-row gemv entry and the rope fold
    for line in lines:
        fields = line.split()
        spill = int(fields[fields.index("spill") + 2])
        wide = int(fields[fields.index("16-byte") + 2])
        assert spill == 0 and wide > 0, line
