"""The decode chain of e2e/decode_chain_gpu_bench.py: one token of Llama-3.1-8B's 32 layers at one
row as the runtime's kernels run it (Chain), captured as one CUDA graph and timed by replay
(run_chain). The folds and launches a run compares are the Chain's own switches."""

from __future__ import annotations

import dataclasses

LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 32, 4096, 32, 8, 128, 14336
CONTEXT, BLOCK = 512, 16
# projection: (N, K, act)
SHAPES = {"qkv_proj": (6144, 4096, None), "o_proj": (4096, 4096, None),
          "gate_up_proj": (2 * INTER, 4096, None), "down_proj": (4096, INTER, "silu_mul"),
          # with the folds: gate_up with silu(gate) * up in its epilogue, down fed the activation
          "gate_up_glu": (2 * INTER, 4096, "silu_mul_out"), "down_plain": (4096, INTER, None)}
WEIGHTS = {"gate_up_glu": "gate_up_proj", "down_plain": "down_proj"}  # the projection a variant reads
UNFOLDED = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
FOLDED = ("qkv_proj", "o_proj", "gate_up_glu", "down_plain")


class Chain:
    """32 layers of weights, caches and the decode step's metadata, and the forward of one token."""

    def __init__(self, torch, device, fp8: bool, dims: dict):
        from pagoda.kernels.quant_fp8_ref import quantize_weight_fp8_ref

        self.torch, self.fp8, self.d = torch, fp8, dims
        d, bf16 = dims, torch.bfloat16
        shapes = {"qkv_proj": ((d["heads"] + 2 * d["kv_heads"]) * d["head_dim"], d["hidden"]),
                  "o_proj": (d["hidden"], d["heads"] * d["head_dim"]),
                  "gate_up_proj": (2 * d["inter"], d["hidden"]), "down_proj": (d["hidden"], d["inter"])}
        self.layers = []
        blocks = d["context"] // BLOCK + 1
        for _ in range(d["layers"]):
            layer = {}
            for name, (n, k) in shapes.items():
                w = (torch.randn(n, k, device=device) / k**0.5).to(bf16)
                layer[name] = quantize_weight_fp8_ref(w) if fp8 else (w,)
            layer["norms"] = [torch.ones(d["hidden"], device=device, dtype=bf16) + 0.01 * torch.randn(
                d["hidden"], device=device, dtype=bf16) for _ in range(2)]
            layer["cache"] = [torch.randn(blocks, BLOCK, d["kv_heads"], d["head_dim"], device=device).to(bf16)
                              for _ in range(2)]
            self.layers.append(layer)
        self.configs = {}  # projection -> GemvConfig overriding the runtime's launch (FP8 only)
        self.folds = frozenset()  # FP8: "norm" (the norms into the next GEMV), "glu" (silu(gate) * up),
        # "sumsq", "tma" (see the docstring)
        self.tma_configs = {}  # projection -> kernels.gemv_tma.TmaGemvConfig for "tma" (absent: its default)
        self.x = torch.randn(1, d["hidden"], device=device).to(bf16)
        self.positions = torch.tensor([d["context"] - 1], device=device)
        half = d["head_dim"] // 2
        inv = 1.0 / (10000 ** (torch.arange(half, device=device).float() / half))
        angles = torch.arange(d["context"] + 1, device=device).float()[:, None] * inv[None, :]
        self.cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)
        self.slot = torch.tensor([d["context"] - 1], device=device)
        self.block_tables = torch.arange(blocks, device=device, dtype=torch.int32)[None, :]
        self.seq_lens = torch.tensor([d["context"]], device=device, dtype=torch.int32)
        self.qsl = torch.tensor([0, 1], device=device, dtype=torch.int32)

    def runtime_config(self, name, x):
        """The launch the runtime takes for a projection at one row (None on the CPU: the heuristic)."""
        from pagoda.kernels import fp8_dispatch, ops

        n, k, act = SHAPES[name]
        if not x.is_cuda:
            return None
        if act == "silu_mul_out":
            launch = fp8_dispatch.fused_glu(1, n, k, x.device)
        else:
            launch = ops.fp8_path(x, self.layers[0][WEIGHTS.get(name, name)][0], None, act)
        assert launch is not None and launch.path == "gemv", f"{name}: the runtime takes no GEMV at one row"
        return launch.config

    def linear(self, layer, name, x, norm=None, add_to=None):
        """The projection's output; with add_to (the residual stream), it is added there in place and
        (the stream, its squares summed per program) comes back, for the next GEMV's norm."""
        from pagoda.kernels import ops
        from pagoda.kernels.gemv import ResidualSumsq, gemv_config

        act = SHAPES[name][2]
        if self.fp8:
            w, s = layer[WEIGHTS.get(name, name)]
            if "tma" in self.folds and act != "silu_mul" and norm is None and add_to is None:
                from pagoda.kernels.gemv_tma import gemv_tma

                return gemv_tma(x, w, s, config=self.tma_configs.get(name), epilogue="silu_mul" if act else None)
            cfg = self.configs.get(name) or self.runtime_config(name, x)
            if act == "silu_mul_out":
                return ops.fp8_gemv(x, w, s, config=cfg, norm=norm, epilogue="silu_mul")
            if add_to is not None:
                block_n = (cfg or gemv_config(1, w.shape[0], w.shape[1], weight_bytes=1)).block_n
                sumsq = self.torch.empty(-(-w.shape[0] // block_n), dtype=self.torch.float32, device=x.device)
                ops.fp8_gemv(x, w, s, act=act, config=cfg, out=add_to, residual_sumsq=ResidualSumsq(add_to, sumsq))
                return add_to, sumsq
            return ops.fp8_gemv(x, w, s, act=act, config=cfg, norm=norm)
        (w,) = layer[name]
        return ops.silu_and_mul_linear(x, w) if act else ops.linear(x, w)

    def rope_qkv(self, layer, h, kc, vc):
        """The rotated query of the qkv GEMV with rotary and the cache write in its epilogue
        (kernels/gemv_rope.py, the engine's --fold-rope-kv), at the runtime's qkv launch, one split."""
        from pagoda.kernels import gemv as gemv_kernels
        from pagoda.kernels.gemv_rope import RopeKv, gemv_rope_kv

        d = self.d
        w, s = layer["qkv_proj"] if self.fp8 else (layer["qkv_proj"][0], None)
        n, k = w.shape
        cfg = self.configs.get("qkv_proj") if self.fp8 else None
        if cfg is None and h.is_cuda:
            cfg = self.runtime_config("qkv_proj", h) if self.fp8 else gemv_kernels.measured_win(1, n, k, None, h.device)
        cfg = cfg or gemv_kernels.gemv_config(1, n, k, weight_bytes=1 if self.fp8 else 2)
        cfg = dataclasses.replace(cfg, split_k=1, block_n=min(cfg.block_n, d["head_dim"] // 2))
        rope = RopeKv(self.positions, self.cos_sin, kc, vc, self.slot, d["heads"], d["kv_heads"])
        return gemv_rope_kv(h, w, None, rope, weight_scale=s, config=cfg).view(1, d["heads"], d["head_dim"])

    def normed(self, x, weight, residual):
        """(the next GEMV's input, its norm fold or None, the residual stream after the norm)."""
        from pagoda.kernels import ops
        from pagoda.kernels.gemv import GemvNorm

        if "norm" in self.folds:
            residual_out = None if residual is None else self.torch.empty_like(x)
            return x, GemvNorm(weight, 1e-5, residual, residual_out), (x if residual is None else residual_out)
        if residual is None:
            return ops.rms_norm(x, weight, 1e-5), None, x
        h, residual = ops.rms_norm(x, weight, 1e-5, residual)
        return h, None, residual

    def forward(self):
        from pagoda.kernels import ops
        from pagoda.kernels.gemv import GemvNorm
        from pagoda.kernels.paged_attention_decode import paged_attention_decode

        d = self.d
        x, residual, sumsq = self.x, None, None
        summed = "sumsq" in self.folds  # o_proj and down add to the stream and sum its squares
        for layer in self.layers:
            if sumsq is not None:
                h, norm = residual, GemvNorm(layer["norms"][0], 1e-5, sumsq=sumsq)
            else:
                h, norm, residual = self.normed(x, layer["norms"][0], residual)
                residual = residual.clone() if summed else residual  # the stream is written in place
            kc, vc = layer["cache"]
            if "rope" in self.folds and norm is None:  # one kernel: qkv, rotary and the cache write
                q = self.rope_qkv(layer, h, kc, vc)
            else:
                qkv = self.linear(layer, "qkv_proj", h, norm)
                q_end, k_end = d["heads"] * d["head_dim"], (d["heads"] + d["kv_heads"]) * d["head_dim"]
                q = qkv[:, :q_end].view(1, d["heads"], d["head_dim"])
                k = qkv[:, q_end:k_end].view(1, d["kv_heads"], d["head_dim"])
                v = qkv[:, k_end:].view(1, d["kv_heads"], d["head_dim"])
                q = ops.rotary_kv_cache(self.positions, q, k, v, self.cos_sin, kc, vc, self.slot)
            attn = paged_attention_decode(q, kc, vc, self.block_tables, self.seq_lens, self.qsl,
                                          d["head_dim"] ** -0.5, max_seq_len=d["context"])
            if summed:
                h, sumsq = self.linear(layer, "o_proj", attn.view(1, -1), add_to=residual)
                norm = GemvNorm(layer["norms"][1], 1e-5, sumsq=sumsq)
            else:
                o = self.linear(layer, "o_proj", attn.view(1, -1))
                h, norm, residual = self.normed(o, layer["norms"][1], residual)
            up, down = ("gate_up_glu", "down_plain") if "glu" in self.folds else ("gate_up_proj", "down_proj")
            act = self.linear(layer, up, h, norm)
            if summed:
                _, sumsq = self.linear(layer, down, act, add_to=residual)
            else:
                x = self.linear(layer, down, act)
        return residual if summed else x + residual


def run_chain(torch, chain: Chain, pdl_on: bool, replays: int, smoke: bool) -> tuple[float | None, object]:
    """(median ms per replay of the captured chain, its output) with PDL on or off."""
    from pagoda.kernels import pdl

    pdl.ENABLED = pdl_on and not smoke
    try:
        if smoke:
            return None, chain.forward().clone()
        torch.cuda.synchronize()
        out = chain.forward()  # builds the kernels outside the capture
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            chain.forward()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = chain.forward()
        ms = median_replay_ms(torch, graph, replays)
        result = out.clone()
        del graph
        return ms, result
    finally:
        pdl.ENABLED = False


def median_replay_ms(torch, graph, replays: int, warmup: int = 10) -> float:
    """The median of `replays` timed replays of a captured CUDA graph, after `warmup` untimed ones."""
    for _ in range(warmup):
        graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]
