"""The peer: Hugging Face transformers' `generate`, on the same config and the same requests.

Random weights come from the same config.json (`load_format="dummy"`), so both sides do the same
arithmetic; the peer uses sdpa attention and static batching with left padding, as BENCHMARKS.md
measured it.
"""

from __future__ import annotations


def load_hf_model(model_path, load_format: str, dtype: str, device: str):
    """The peer model: the same config with random weights (or the checkpoint's, if asked), sdpa."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    config = AutoConfig.from_pretrained(model_path)
    if dtype == "auto":
        dtype = str(getattr(config, "torch_dtype", None) or getattr(config, "dtype", None) or "float32")
    torch_dtype = getattr(torch, dtype.replace("torch.", ""))
    if load_format == "dummy":
        torch.manual_seed(0)
        # Built on the device directly: an 8B random init on the CPU takes minutes.
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype, attn_implementation="sdpa")
    else:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype, attn_implementation="sdpa")
        model.to(device)
    return model.eval(), device


def pad_token_id(model) -> int:
    pad = model.config.pad_token_id
    if pad is None:
        eos = model.config.eos_token_id
        pad = (eos[0] if isinstance(eos, list) else eos) or 0
    return pad


def generate_batch(model, device, prompts: list[list[int]], output_len: int) -> int:
    """One static batch, left-padded; exactly `output_len` new tokens per row (EOS ignored)."""
    import torch

    pad = pad_token_id(model)
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        input_ids[i, width - len(p):] = torch.tensor(p)
        attention_mask[i, width - len(p):] = 1
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            max_new_tokens=output_len,
            min_new_tokens=output_len,
            do_sample=False,
            pad_token_id=pad,
        )
    return int((out.shape[1] - width) * out.shape[0])


def reset_peak_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def peak_memory_gib() -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


