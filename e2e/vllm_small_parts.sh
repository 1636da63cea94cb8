#!/usr/bin/env bash
# vLLM 0.26's peer bundle cut small enough to travel beside this tree. ../shared/tools/vllm-peer/pack
# cuts it into 58-MiB parts, but a device call carries at most 64 MiB with the working tree, which is
# about 30 MB (most of it e2e/demo-model's weights): a 58-MiB part no longer fits (2026-12-04).
#   bash e2e/vllm_small_parts.sh            (from the repository root; packs first if .vllm/wheels is absent)
# leaves .vllm/small/part-00 ... (PART_MIB, default 28 MiB each, about 14 parts) and the installer beside
# them. Send one part per device call, back to back (an idle machine is given back after 30 s):
#   carry [".vllm/small/part-NN"], command: mkdir -p /tmp/vparts && cp .vllm/small/part-NN /tmp/vparts/
# A part also fits beside a measurement call's own carry (the tree, about 30 MB, .whl/ 3 MB and one
# 28-MiB part stay under 64 MiB when the call runs in the copied tree rather than from a tarball of it):
#   carry [".whl", ".vllm/small/part-NN"], command: mkdir -p /tmp/vparts && cp .vllm/small/part-NN /tmp/vparts/ && ...
# so the parts can ride along with the session's first calls instead of 14 calls of their own.
# With e2e/demo-model/ and e2e/results/ moved out of the working tree for those calls (and back after; no
# device stage needs them: the bench models are made on the machine), the tree is 2.9 MB and two parts
# ride in each call, .whl/ too: 2.9 MB + 3 MB + 2 x 28 MiB = 61.9 MiB (measured 2026-12-06), so 7 calls.
# then, in the call that runs vLLM, carry .vllm/small/install-on-gpu as .vllm/install-on-gpu's stand-in:
#   VLLM_PARTS=/tmp/vparts bash e2e/run_fp8.sh OUT vllm     (run_fp8.sh's vllm stage installs from there)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
[ -d .vllm/wheels ] || ../shared/tools/vllm-peer/pack
rm -rf .vllm/small && mkdir -p .vllm/small
tar -C .vllm -cf - wheels | split -b "${PART_MIB:-28}m" -d - .vllm/small/part-
cp ../shared/tools/vllm-peer/install-on-gpu .vllm/small/
ls -la .vllm/small
