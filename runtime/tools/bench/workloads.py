"""The workloads of BENCHMARKS.md: request lists drawn exactly as specified, and the model shapes.

Every draw uses `random.Random(seed)` and the order BENCHMARKS.md gives, one request after another:
the prompt length, then that prompt's token ids. The same seed therefore gives the same prompts in
every tool that reads this module (the engine bench, the HF peer, the serving load generator).

`--model w1` / `--model w4` / `--model w5` (and `tiny`, for CPU smoke runs) need no download: `model_folder` writes config.json and a synthetic
tokenizer whose vocabulary covers the whole config vocabulary, and the engine runs with
`load_format="dummy"` (random weights).
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

PROMPT_LEN_RANGE = (128, 1024)
TOKEN_ID_RANGE = (10, 30000)  # randrange: 10 <= id < 30000
W1_NUM_REQUESTS = 256
W1_OUTPUT_LEN = 256
W2_PROMPT_LEN = 128
W2_OUTPUT_LEN = 256
W3_NUM_REQUESTS = 512
W3_OUTPUT_LEN_RANGE = (64, 512)
W3_REQUEST_RATES = ("4", "8", "16", "32", "inf")
W4_NUM_REQUESTS = 1024

# Llama-3.1-8B's config.json, as published (W1, W2, W3).
LLAMA_3_1_8B: dict = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "initializer_range": 0.02,
    "torch_dtype": "bfloat16",
}

# Qwen2.5-0.5B's config.json (W4): tied embeddings, qkv bias (implied by the Qwen2 architecture).
QWEN2_5_0_5B: dict = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "sliding_window": 32768,
    "max_window_layers": 24,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "initializer_range": 0.02,
    "torch_dtype": "bfloat16",
}

# Qwen3-30B-A3B's config.json (W5): 128 experts, top-8, q/k norms, no qkv bias.
QWEN3_30B_A3B: dict = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "attention_bias": False,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 48,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "initializer_range": 0.02,
    "torch_dtype": "bfloat16",
}

# For CPU smoke runs of every bench: Llama-shaped and tiny, but its vocabulary covers the token ids
# the workloads draw (below 30,000), which the 512-token test checkpoints do not.
TINY: dict = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 30016,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "initializer_range": 0.02,
    "torch_dtype": "float32",
}

# "-bpe": the same model with a made-up byte-level BPE tokenizer (bench/bpe_vocab.py), whose tokens
# can spell JSON: W1-json (structured outputs) needs one; the word-level tokenizer cannot.
MODEL_CONFIGS = {"w1": LLAMA_3_1_8B, "w4": QWEN2_5_0_5B, "w5": QWEN3_30B_A3B, "tiny": TINY, "w1-bpe": LLAMA_3_1_8B,
                 "tiny-bpe": TINY}

# Special tokens of the synthetic tokenizers, at the ids the real checkpoints use.
_SPECIAL_TOKENS = {
    "w1": {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128008: "<|eom_id|>", 128009: "<|eot_id|>"},
    "w4": {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>"},
    "w5": {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>"},
    "tiny": {1: "<|bos|>", 2: "<|eos|>"},
}
_SPECIAL_TOKENS["w1-bpe"], _SPECIAL_TOKENS["tiny-bpe"] = _SPECIAL_TOKENS["w1"], _SPECIAL_TOKENS["tiny"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|> ' + message['role'] + ' ' + message['content'] + ' <|im_end|> ' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|> assistant ' }}{% endif %}"
)


@dataclass(slots=True)
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int


def draw_prompts(rng: random.Random, num_requests: int) -> list[list[int]]:
    """W1's draw: per request, the length, then each token id (the order matters for the seed)."""
    prompts = []
    for _ in range(num_requests):
        length = rng.randint(*PROMPT_LEN_RANGE)
        prompts.append([rng.randrange(*TOKEN_ID_RANGE) for _ in range(length)])
    return prompts


def offline_requests(num_requests: int = W1_NUM_REQUESTS, output_len: int = W1_OUTPUT_LEN, seed: int = 0):
    """W1 (256 requests) and W4 (1,024 requests): every output exactly `output_len` tokens."""
    return [BenchRequest(p, output_len) for p in draw_prompts(random.Random(seed), num_requests)]


def w1_requests(seed: int = 0) -> list[BenchRequest]:
    return offline_requests(W1_NUM_REQUESTS, W1_OUTPUT_LEN, seed)


def w4_requests(seed: int = 0) -> list[BenchRequest]:
    return offline_requests(W4_NUM_REQUESTS, W1_OUTPUT_LEN, seed)


def w2_request(seed: int = 0) -> BenchRequest:
    rng = random.Random(seed)
    return BenchRequest([rng.randrange(*TOKEN_ID_RANGE) for _ in range(W2_PROMPT_LEN)], W2_OUTPUT_LEN)


def serving_requests(
    num_requests: int = W3_NUM_REQUESTS,
    seed: int = 0,
    input_len: tuple[int, int] = PROMPT_LEN_RANGE,
    output_len: tuple[int, int] = W3_OUTPUT_LEN_RANGE,
) -> list[BenchRequest]:
    """W3: prompts drawn as W1 (so the first 256 are W1's prompts with the default ranges), then
    all output lengths from the same generator."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(num_requests):
        length = rng.randint(*input_len)
        prompts.append([rng.randrange(*TOKEN_ID_RANGE) for _ in range(length)])
    output_lens = [rng.randint(*output_len) for _ in range(num_requests)]
    return [BenchRequest(p, n) for p, n in zip(prompts, output_lens)]


# W5 is W1's requests on the mixture-of-experts model.
WORKLOADS = {"W1": w1_requests, "W4": w4_requests, "W5": w1_requests}
WORKLOAD_MODEL = {"W1": "w1", "W2": "w1", "W3": "w1", "W4": "w4", "W5": "w5"}


# --- model folders ----------------------------------------------------------------------------


def default_cache_dir() -> Path:
    base = os.environ.get("PAGODA_BENCH_CACHE") or os.path.join(Path.home(), ".cache", "pagoda", "bench-models")
    return Path(base)


def build_synthetic_tokenizer(name: str):
    """A word-level tokenizer with one token per id of the config vocabulary ("t123" is id 123).

    Random weights emit any id below vocab_size, so a small trained tokenizer cannot detokenize
    them; this one can, at a per-token cost like a real fast tokenizer's. Loaded as a generic fast
    tokenizer (Llama-family folders: w1, tiny), its text round-trips: decode(ids) re-encodes to the
    same ids, which the serving bench's text fallback relies on. transformers 5 loads a qwen2
    folder (w4) with its own Qwen2Tokenizer class, which keeps the vocabulary (every id decodes)
    but not this pre-tokenizer.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    config = MODEL_CONFIGS[name]
    special = _SPECIAL_TOKENS[name]
    if name.endswith("-bpe"):
        from pagoda.runtime.tools.bench.bpe_vocab import build_bpe_tokenizer

        tok, unk = build_bpe_tokenizer(config["vocab_size"], special), None
    else:
        vocab = {special.get(i, f"t{i}"): i for i in range(config["vocab_size"])}
        tok, unk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0")), "t0"
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    eos_id = config["eos_token_id"]
    eos_id = eos_id[-1] if isinstance(eos_id, list) else eos_id
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=special[config["bos_token_id"]],
        eos_token=special[eos_id],
        unk_token=unk,
        additional_special_tokens=[t for i, t in special.items() if i not in (config["bos_token_id"], eos_id)],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def model_folder(name: str, path: str | Path | None = None) -> Path:
    """Write (once) a weightless model folder for `w1`, `w4` or `tiny`: config.json plus tokenizer."""
    name = name.lower()
    if name not in MODEL_CONFIGS:
        raise ValueError(f"unknown bench model {name!r}; choose one of {sorted(MODEL_CONFIGS)} or pass a path")
    path = Path(path) if path is not None else default_cache_dir() / name
    config = MODEL_CONFIGS[name]
    marker = path / "pagoda_bench.json"
    if marker.exists() and json.loads((path / "config.json").read_text()) == config:
        return path
    path.mkdir(parents=True, exist_ok=True)
    build_synthetic_tokenizer(name).save_pretrained(path)
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    marker.write_text(json.dumps({"bench_model": name, "weights": "none; use load_format=dummy"}) + "\n")
    return path


def resolve_model(model: str) -> Path:
    """`w1`/`w4`/`tiny` (or `w1-bpe`, `tiny-bpe`) -> a synthetic folder in the cache; anything else is a
    checkpoint folder."""
    if model.lower() in MODEL_CONFIGS:
        return model_folder(model)
    path = Path(model)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{model!r} is neither w1/w4/tiny nor a folder with a config.json")
    return path


def load_config(path: str | Path) -> dict:
    return json.loads((Path(path) / "config.json").read_text())
