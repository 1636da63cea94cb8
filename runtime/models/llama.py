"""The Llama family: Llama 2/3, Mistral and Qwen2 (qkv bias, tied embeddings) in one model.

Inputs are flat: every token of every sequence in the step, back to back, with its position.
Attention learns which sequence a token belongs to from the AttentionContext.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn

from pagoda.runtime.layers.attention import Attention
from pagoda.runtime.layers.fused_moe import EXPERT_PARTS, STACKED_EXPERTS
from pagoda.runtime.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from pagoda.runtime.layers.norm import RMSNorm
from pagoda.runtime.layers.parallel_state import divide, get_tp_size, kv_heads_per_rank
from pagoda.runtime.layers.rotary import RotaryEmbedding
from pagoda.runtime.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding
from pagoda.runtime.layers.weight_slice import is_fp8, materialize
from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.models.hf_fields import attention_scale, layer_windows, rotary_dim

# model.layers.3.mlp.experts.17.gate_proj.weight -> (model.layers.3.mlp, 17, gate_proj, weight); FP8
# checkpoints add each expert matrix's weight_scale and (static activations) input_scale
EXPERT_TENSOR = re.compile(r"(.+)\.experts\.(\d+)\.(\w+)\.(weight|weight_scale|input_scale)")
EXPERT_SUFFIX = {"weight": "", "weight_scale": "_weight_scale", "input_scale": "_input_scale"}
# model.layers.3.mlp.experts.gate_up_proj -> (model.layers.3.mlp, gate_up_proj)
STACKED_EXPERT_WEIGHT = re.compile(r"(.+)\.experts\.(gate_up_proj|down_proj)")
# model.layers.3.self_attn.k_scale (compressed-tensors, newer fp8) or .k_proj.output_scale (older fp8)
KV_SCALE = re.compile(r"(.+)\.self_attn\.(?:([kv])_scale|([kv])_proj\.output_scale)")


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, rotary_emb: RotaryEmbedding):
        super().__init__()
        # This rank's heads; KV heads are replicated when there are fewer of them than ranks.
        tp = get_tp_size()
        self.num_heads = divide(cfg.num_heads, tp)
        self.num_kv_heads = kv_heads_per_rank(cfg.num_kv_heads, tp)
        self.q_size = self.num_heads * cfg.head_dim
        self.kv_size = self.num_kv_heads * cfg.head_dim
        self.qkv_proj = QKVParallelLinear(
            cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.qkv_bias
        )
        self.o_proj = RowParallelLinear(cfg.num_heads * cfg.head_dim, cfg.hidden_size)
        self.rotary_emb = rotary_emb  # one table for every layer that shares its parameters
        hf = cfg.hf_config
        self.attn = Attention(
            self.num_heads, cfg.head_dim, self.num_kv_heads, attention_scale(hf, cfg.head_dim),
            sliding_window=layer_windows(hf)[layer_idx], softcap=hf.get("attn_logit_softcapping"),
        )

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        # one decode row with --fold-rope-kv: qkv_proj's kernel rotates q and k and writes the cache
        q = self.attn.project_rotated(self.qkv_proj, hidden, positions, self.rotary_emb.cos_sin_cache)
        if q is not None:
            return self.o_proj(self.attn.attend_rotated(q))
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(q.shape[0], self.num_heads, -1)
        k = k.reshape(k.shape[0], self.num_kv_heads, -1)
        return self.o_proj(self.attn(q, k, v, positions, self.rotary_emb.cos_sin_cache))

    @staticmethod
    def checkpoint_shapes(cfg: ModelConfig, p: str) -> list[tuple[str, tuple[int, ...]]]:
        h, d = cfg.hidden_size, cfg.head_dim
        q, kv = cfg.num_heads * d, cfg.num_kv_heads * d
        shapes = []
        for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            shapes.append((f"{p}self_attn.{name}.weight", (rows, h)))
            if cfg.qkv_bias:
                shapes.append((f"{p}self_attn.{name}.bias", (rows,)))
        return shapes + [(p + "self_attn.o_proj.weight", (h, q))]


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int = 0):
        super().__init__()
        inter = cfg.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(cfg.hidden_size, [inter] * 2)
        self.down_proj = RowParallelLinear(inter, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # At one FP8 row the activation comes out of gate_up's kernel; elsewhere it goes into down's.
        act = self.gate_up_proj.forward_glu(x)
        if act is not None:
            return self.down_proj(act)
        return self.down_proj.forward_silu_mul(self.gate_up_proj(x))

    @staticmethod
    def checkpoint_shapes(cfg: ModelConfig, p: str, layer_idx: int = 0) -> list[tuple[str, tuple[int, ...]]]:
        h, inter = cfg.hidden_size, cfg.intermediate_size
        return [
            (p + "mlp.gate_proj.weight", (inter, h)),
            (p + "mlp.up_proj.weight", (inter, h)),
            (p + "mlp.down_proj.weight", (h, inter)),
        ]


class LlamaDecoderLayer(nn.Module):
    attention_cls = LlamaAttention
    mlp_cls = LlamaMLP
    # Norms whose output feeds only that layer: with FP8 weights they quantize its input
    # themselves (quantization/apply.link_norms).
    fp8_norm_inputs = (("input_layernorm", "self_attn.qkv_proj"), ("post_attention_layernorm", "mlp.gate_up_proj"))
    # Layers whose output goes straight into a norm with the residual (post_attention_layernorm, the
    # next layer's input_layernorm or the final norm): with FP8 weights they may add it to the
    # residual stream in their own kernel (quantization/fp8_residual.py).
    fp8_residual_producers = ("self_attn.o_proj", "mlp.down_proj")

    def __init__(self, cfg: ModelConfig, layer_idx: int, rotary_emb: RotaryEmbedding):
        super().__init__()
        self.self_attn = self.attention_cls(cfg, layer_idx, rotary_emb)
        self.mlp = self.make_mlp(cfg, layer_idx)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, positions, hidden, residual):
        # The residual add is fused into each norm: norm(x + residual), with the sum carried on.
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual

    @classmethod
    def make_mlp(cls, cfg: ModelConfig, layer_idx: int) -> nn.Module:
        return cls.mlp_cls(cfg, layer_idx)

    @classmethod
    def mlp_checkpoint_shapes(cls, cfg: ModelConfig, p: str, layer_idx: int) -> list[tuple[str, tuple[int, ...]]]:
        return cls.mlp_cls.checkpoint_shapes(cfg, p, layer_idx)

    @classmethod
    def checkpoint_shapes(cls, cfg: ModelConfig, layer_idx: int) -> list[tuple[str, tuple[int, ...]]]:
        h, p = cfg.hidden_size, f"model.layers.{layer_idx}."
        norms = [(p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))]
        return (norms + cls.attention_cls.checkpoint_shapes(cfg, p)
                + cls.mlp_checkpoint_shapes(cfg, p, layer_idx))


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_cls: type[LlamaDecoderLayer] = LlamaDecoderLayer):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        rotary = self.layer_rotary_embeddings(cfg)
        self.layers = nn.ModuleList(layer_cls(cfg, i, rotary[i]) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    @staticmethod
    def layer_rotary_embeddings(cfg: ModelConfig) -> list[RotaryEmbedding]:
        """Each layer's rotary table; layers with the same rope parameters share one."""
        dim = rotary_dim(cfg.hf_config, cfg.head_dim)
        shared = RotaryEmbedding(dim, cfg.max_model_len, cfg.rope_theta, cfg.rope_scaling)
        return [shared] * cfg.num_layers

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    model_cls = LlamaModel
    layer_cls = LlamaDecoderLayer
    checkpoint_renames: tuple[tuple[str, str], ...] = ()  # checkpoint name fragment -> ours
    # checkpoint name fragment -> (our fused parameter, shard id)
    stacked_params = (
        (".q_proj.", ".qkv_proj.", "q"),
        (".k_proj.", ".qkv_proj.", "k"),
        (".v_proj.", ".qkv_proj.", "v"),
        (".gate_proj.", ".gate_up_proj.", 0),
        (".up_proj.", ".gate_up_proj.", 1),
    )

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = self.model_cls(cfg, self.layer_cls)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size)
        if cfg.tie_word_embeddings:
            self.lm_head.tie_to(self.model.embed_tokens)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.model.layers]

    @classmethod
    def checkpoint_shapes(cls, cfg: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
        """The unsharded tensors of a Hugging Face checkpoint of this config, in a fixed order:
        dummy weights are drawn in these shapes, so they do not depend on the parallel size."""
        h = cfg.hidden_size
        shapes = [("model.embed_tokens.weight", (cfg.vocab_size, h))]
        for i in range(cfg.num_layers):
            shapes += cls.layer_cls.checkpoint_shapes(cfg, i)
        shapes.append(("model.norm.weight", (h,)))
        if not cfg.tie_word_embeddings:
            shapes.append(("lm_head.weight", (cfg.vocab_size, h)))
        return shapes

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load (name, tensor or lazy safetensors slice) pairs; each loader reads its own shard."""
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            for ckpt_part, our_part in self.checkpoint_renames:
                name = name.replace(ckpt_part, our_part)
            if kv_scale := KV_SCALE.fullmatch(name):  # the FP8 KV cache's per-tensor scale
                prefix, k_or_v, old = kv_scale.groups()
                attn = self.get_submodule(f"{prefix}.self_attn.attn")
                setattr(attn, f"{k_or_v or old}_scale", float(materialize(tensor).float().max()))
                continue
            if is_fp8(tensor) and name.endswith("gate.weight"):
                raise ValueError(f"FP8 checkpoint tensor {name!r}: an FP8 MoE router is not supported (Pagoda "
                                 "keeps routers in the compute dtype, as vLLM does; FP8 experts are supported)")
            if expert := EXPERT_TENSOR.fullmatch(name):  # one tensor of one expert: into the stack
                if target := self._load_expert(params, name, tensor, *expert.groups()):
                    loaded.add(target)
                continue
            if stacked := STACKED_EXPERT_WEIGHT.fullmatch(name):  # transformers 5's in-memory layout
                prefix, kind = stacked.groups()
                if is_fp8(tensor):
                    raise ValueError(f"FP8 checkpoint tensor {name!r}: FP8 experts are read one matrix per expert "
                                     "(experts.N.gate_proj.weight and its weight_scale), not stacked")
                target = f"{prefix}.{STACKED_EXPERTS[kind]}"
                self.get_submodule(prefix).stacked_loader(params[target], tensor, kind)
                loaded.add(target)
                continue
            for ckpt_part, our_part, shard_id in self.stacked_params:
                if ckpt_part in name:
                    target = name.replace(ckpt_part, our_part)
                    params[target].weight_loader(params[target], tensor, shard_id)
                    loaded.add(target)
                    break
            else:
                if name not in params:
                    raise ValueError(f"checkpoint tensor {name!r} has no place in {type(self).__name__}")
                param = params[name]
                loader = getattr(param, "weight_loader", None)
                loader(param, tensor) if loader else param.data.copy_(materialize(tensor))
                loaded.add(name)
        return loaded

    @staticmethod
    def _load_expert(params: dict, name: str, tensor, prefix: str, index: str, part_name: str, kind: str) -> str | None:
        """An expert matrix, its weight_scale or its input_scale, into the block's stacked parameter;
        returns that parameter's name (None for an input scale that dynamic activations leave unused)."""
        param_name, part = EXPERT_PARTS[part_name]
        target = f"{prefix}.{param_name}{EXPERT_SUFFIX[kind]}"
        if kind == "input_scale" and target not in params:
            return None  # dynamic activations: the checkpoint's calibration scales are not used
        if target not in params:
            raise ValueError(f"checkpoint tensor {name!r}: these experts are not FP8 in this model's quantization "
                             "scheme, so their tensors carry no scales")
        if kind == "weight" and is_fp8(tensor) != (params[target].dtype == torch.float8_e4m3fn):
            raise ValueError(f"checkpoint tensor {name!r} is {'' if is_fp8(tensor) else 'not '}FP8, but the "
                             f"quantization scheme {'leaves these experts unquantized' if is_fp8(tensor) else 'says FP8'}")
        params[target].weight_loader(params[target], tensor, int(index), part)
        return target
