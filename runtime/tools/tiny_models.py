"""Tiny Hugging Face-format checkpoints with random weights, built by transformers' own classes.

Tests, the kind end-to-end script and benchmarks' smoke runs use them: the same classes, loaded in
transformers, are the correctness reference for the engine. Everything is deterministic from a seed
and takes well under a second per model, so no model hub is ever needed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

FAMILIES = ("llama", "llama3", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe", "gemma2", "gemma3", "phi3")
# Image-text checkpoints, served text only: not in FAMILIES, whose tests assume a text-only layout.
VLM_FAMILIES = ("gemma3_vlm", "mistral3_vlm", "qwen2_vl", "qwen2_5_vl")

SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"]

# ChatML, the format Qwen2 and many fine-tunes use; generation stops at <|im_end|>.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(slots=True)
class TinySpec:
    family: str = "llama"
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vocab_size: int = 512
    max_position_embeddings: int = 1024
    seed: int = 0
    max_shard_size: str | None = "40KB"  # small enough that every tiny model is sharded
    extra: dict = field(default_factory=dict)


def _training_text() -> list[str]:
    """A frozen snapshot of some of the repository's own text (tiny_corpus.txt). It is a file of
    its own, not the live sources, so that editing code never changes the tiny tokenizers."""
    return [(Path(__file__).resolve().parent / "tiny_corpus.txt").read_text(encoding="utf-8")]


def train_byte_level_bpe(texts: list[str], vocab_size: int, special_tokens: list[str]):
    """A byte-level BPE (the GPT-2/Llama-3 kind) trained with `tokenizers` on `texts`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def build_tokenizer(vocab_size: int = 512):
    """The tiny models' tokenizer, wrapped as a transformers fast tokenizer."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=train_byte_level_bpe(_training_text(), vocab_size, SPECIAL_TOKENS),
        bos_token="<|bos|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        additional_special_tokens=["<|eos|>", "<|im_start|>"],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def _config(spec: TinySpec, tokenizer):
    import transformers as tf

    common = dict(
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        vocab_size=spec.vocab_size,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        rms_norm_eps=1e-5,
    )
    if spec.family == "llama":
        cfg = tf.LlamaConfig(**common, rope_theta=10000.0)
    elif spec.family == "llama3":
        cfg = tf.LlamaConfig(
            **common,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        )
    elif spec.family == "mistral":
        cfg = tf.MistralConfig(**common, rope_theta=10000.0, sliding_window=None)
    elif spec.family == "qwen2":
        cfg = tf.Qwen2Config(**common, rope_theta=1000000.0, tie_word_embeddings=True)
    elif spec.family == "qwen3":
        cfg = tf.Qwen3Config(**common, head_dim=16, rope_theta=1000000.0)
    elif spec.family == "mixtral":
        cfg = tf.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2, rope_theta=1000000.0)
    elif spec.family == "qwen3_moe":
        # 3 layers, the middle one dense (mlp_only_layers); top-3 of 6 experts, not renormalised
        cfg = tf.Qwen3MoeConfig(**{**common, "num_hidden_layers": 3}, head_dim=16, rope_theta=1000000.0,
                                num_experts=6, num_experts_per_tok=3, moe_intermediate_size=32,
                                norm_topk_prob=False, mlp_only_layers=[1])
    elif spec.family == "gemma2":
        # A window (12) shorter than most test prompts, on layer 0 of 2; caps low enough to bite.
        cfg = tf.Gemma2Config(**common, head_dim=16, query_pre_attn_scalar=24, sliding_window=12,
                              attn_logit_softcapping=5.0, final_logit_softcapping=8.0)
    elif spec.family == "gemma3":
        # Two local layers, then a global one with its own rope base and linear scaling.
        cfg = tf.Gemma3TextConfig(**{**common, "num_hidden_layers": 3}, head_dim=16, query_pre_attn_scalar=16,
                                  sliding_window=12, sliding_window_pattern=3, rope_theta=1000000.0,
                                  rope_local_base_freq=10000.0, rope_scaling={"rope_type": "linear", "factor": 4.0})
    elif spec.family == "gemma3_vlm":
        # The gemma3 text model above under Gemma3ForConditionalGeneration, with a one-layer SigLIP
        # tower (a 28-pixel image in 2 x 2 patches, pooled to one token) so vision weights are written.
        text = _config(TinySpec(**{**_fields(spec), "family": "gemma3", "extra": {}}), tokenizer)
        vision = tf.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                       num_attention_heads=2, image_size=28, patch_size=14)
        cfg = tf.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=1,
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                              bos_token_id=tokenizer.bos_token_id)
        for key, value in spec.extra.items():
            setattr(cfg.text_config, key, value)
        return cfg
    elif spec.family == "mistral3_vlm":
        # Mistral Small 3.1's shape in small: a Mistral text model whose head_dim (24) is not
        # hidden / heads, untied, no window, under Mistral3ForConditionalGeneration with a one-layer
        # Pixtral tower and the patch-merging projector. tie_word_embeddings false at the top level
        # too, as the published checkpoints mean it (transformers 5 writes Mistral3Config's default
        # true there, and then keeps the stored LM head untied).
        text = tf.MistralConfig(**common, head_dim=24, rope_theta=1000000000.0, sliding_window=None,
                                tie_word_embeddings=False)
        vision = tf.PixtralVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, head_dim=8, image_size=28, patch_size=14)
        cfg = tf.Mistral3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), spatial_merge_size=2,
                                image_token_index=tokenizer.pad_token_id, tie_word_embeddings=False)
        for key, value in spec.extra.items():
            setattr(cfg.text_config, key, value)
        return cfg
    elif spec.family in ("qwen2_vl", "qwen2_5_vl"):
        # The qwen2 text model (qkv bias, untied here) with multimodal RoPE: mrope_section splits the
        # 8 rotary frequencies of head_dim 16 into temporal, height and width parts, as Qwen2.5-VL
        # splits 64 into 16, 24, 24. One-layer vision towers merging 2 x 2 patches.
        text = dict(common, rope_theta=1000000.0, tie_word_embeddings=False,
                    rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
        ids = dict(image_token_id=tokenizer.pad_token_id, video_token_id=tokenizer.pad_token_id,
                   vision_start_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
                   vision_end_token_id=tokenizer.convert_tokens_to_ids("<|eos|>"))
        if spec.family == "qwen2_5_vl":
            vision = tf.Qwen2_5_VLVisionConfig(depth=1, hidden_size=16, intermediate_size=32, num_heads=2,
                                               out_hidden_size=spec.hidden_size, fullatt_block_indexes=[0])
            cfg = tf.Qwen2_5_VLConfig(text_config=text, vision_config=vision.to_dict(), tie_word_embeddings=False,
                                      **ids)
        else:
            vision = tf.Qwen2VLVisionConfig(depth=1, embed_dim=16, hidden_size=spec.hidden_size, num_heads=2,
                                            mlp_ratio=2)
            cfg = tf.Qwen2VLConfig(text_config=text, vision_config=vision.to_dict(), tie_word_embeddings=False, **ids)
        for key, value in spec.extra.items():
            setattr(cfg.text_config, key, value)
        return cfg
    elif spec.family == "phi3":
        # LongRoPE, with an original length (256) past every test sequence: the short factors rule
        factors = [1.0 + 0.25 * i for i in range(8)]  # one per rotary frequency (head_dim 16)
        cfg = tf.Phi3Config(**common, original_max_position_embeddings=256, sliding_window=None,
                            rope_scaling={"rope_type": "longrope", "short_factor": factors,
                                          "long_factor": [4 * f for f in factors]})
    else:
        raise ValueError(f"unknown tiny family {spec.family!r}; choose one of {FAMILIES + VLM_FAMILIES}")
    for key, value in spec.extra.items():
        setattr(cfg, key, value)
    return cfg


def _fields(spec: TinySpec) -> dict:
    return {name: getattr(spec, name) for name in TinySpec.__slots__}


def build_tiny_model(path: str | Path, family: str = "llama", seed: int = 0, **overrides) -> Path:
    """Write a tiny checkpoint (config, sharded safetensors, tokenizer) to `path` and return it."""
    import torch
    import transformers as tf

    spec = TinySpec(family=family, seed=seed, **overrides)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(spec.vocab_size)
    config = _config(spec, tokenizer)
    cls = {
        "llama": tf.LlamaForCausalLM,
        "llama3": tf.LlamaForCausalLM,
        "mistral": tf.MistralForCausalLM,
        "qwen2": tf.Qwen2ForCausalLM,
        "qwen3": tf.Qwen3ForCausalLM,
        "mixtral": tf.MixtralForCausalLM,
        "qwen3_moe": tf.Qwen3MoeForCausalLM,
        "gemma2": tf.Gemma2ForCausalLM,
        "gemma3": tf.Gemma3ForCausalLM,
        "phi3": tf.Phi3ForCausalLM,
        "gemma3_vlm": tf.Gemma3ForConditionalGeneration,
        "mistral3_vlm": tf.Mistral3ForConditionalGeneration,
        "qwen2_vl": tf.Qwen2VLForConditionalGeneration,
        "qwen2_5_vl": tf.Qwen2_5_VLForConditionalGeneration,
    }[family]
    torch.manual_seed(seed)
    model = cls(config)
    # Random init is N(0, 0.02); a wider spread makes logits far apart, so greedy ties (which
    # would make token-identity depend on summation order) essentially never happen.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.15 if "embed" not in name else 1.0)
            elif "bias" in name:
                p.normal_(0.0, 0.1)
    model.eval()
    kwargs = {"safe_serialization": True}
    if spec.max_shard_size:
        kwargs["max_shard_size"] = spec.max_shard_size
    model.save_pretrained(path, **kwargs)
    tokenizer.save_pretrained(path)
    (path / "tiny_model.json").write_text(json.dumps({"family": family, "seed": seed, "random_weights": True}))
    return path


ST_POOLING_MODES = ("mean_tokens", "lasttoken", "cls_token")


def write_sentence_transformers(path: str | Path, mode: str = "mean_tokens", normalize: bool = True,
                                hidden_size: int = 64) -> None:
    """modules.json and 1_Pooling/config.json as sentence-transformers saves them (a Normalize module
    when normalize), which the pooling runner reads its pooling from (pagoda.runtime.pooling_config)."""
    path = Path(path)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (path / "2_Normalize").mkdir(exist_ok=True)
    (path / "modules.json").write_text(json.dumps(modules, indent=2))
    (path / "1_Pooling").mkdir(exist_ok=True)
    config = {"word_embedding_dimension": hidden_size, "pooling_mode_cls_token": False,
              "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
              "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
              "pooling_mode_lasttoken": False, "include_prompt": True}
    config[f"pooling_mode_{mode}"] = True
    (path / "1_Pooling" / "config.json").write_text(json.dumps(config, indent=2))


def add_arguments(parser) -> None:
    parser.add_argument("path", help="folder to write the checkpoint into")
    parser.add_argument("--family", default="llama", choices=FAMILIES + VLM_FAMILIES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sentence-transformers", choices=ST_POOLING_MODES, default=None, metavar="MODE",
                        help="also write sentence-transformers pooling files (mean_tokens, lasttoken or "
                             "cls_token, normalized): an embedding checkpoint for --runner pooling")


def run(args) -> int:
    path = build_tiny_model(args.path, args.family, args.seed)
    if args.sentence_transformers:
        write_sentence_transformers(path, args.sentence_transformers)
    print(path)
    return 0
