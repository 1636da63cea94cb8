"""The demo model's card (README.md) and metrics file, written from what the run measured."""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path

import demo_model_data as data

METRICS_FILE = "train_metrics.json"

_FRONT_MATTER = """---
license: other
license_name: psf-2.0
license_link: https://docs.python.org/3/license.html
library_name: transformers
pipeline_tag: text-generation
tags: [llama, python, code, pagoda, demo]
---
"""


def environment(device) -> dict:
    import tokenizers
    import torch
    import transformers

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        commit = commit.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "device": device.type,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "platform": platform.platform(),
        "commit": commit,
    }


def inline_chat_template(out: Path) -> None:
    """Keep the chat template in tokenizer_config.json, where every transformers version and
    other runtimes look, rather than in transformers 5's separate chat_template.jinja."""
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = data.CHAT_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (out / "chat_template.jinja").unlink(missing_ok=True)


def _samples_section(samples: list[dict]) -> str:
    # Four-backtick fences: chat replies carry their own ```python fences.
    parts = []
    for s in samples:
        how = (
            "greedy"
            if s["mode"] == "greedy"
            else f"sampled (temperature {s['temperature']}, top_p {s['top_p']})"
        )
        if s["kind"] == "chat":
            parts.append(f"Chat, {how}. User: *{s['user']}* Assistant:\n\n````\n{s['completion']}\n````\n")
        else:
            parts.append(f"`{s['prompt']!r}`, {how}:\n\n````python\n{s['prompt']}{s['completion']}\n````\n")
    return "\n".join(parts)


def write(out: Path, metrics: dict) -> None:
    (out / METRICS_FILE).write_text(json.dumps(metrics, indent=2, default=str) + "\n")
    env, d, t, h, cfg = (
        metrics["environment"],
        metrics["data"],
        metrics["training"],
        metrics["heldout"],
        metrics["model"]["config"],
    )
    a = metrics["args"]
    hardware = env["gpu"] or f"CPU ({env['platform']})"
    best = next((e for e in t["history"] if e["step"] == t["best_step"]), None)
    card = f"""{_FRONT_MATTER}
# Pagoda demo model: a {metrics["model"]["parameters"] / 1e6:.1f}M-parameter Llama trained on Python's standard library

Pagoda's embedded model, made here because no model hub is reachable from our machines. It serves
`make demo` and the quality tests in `tests/demo_model/`. It completes Python code in the style of
the standard library, and answers chat turns (ChatML) with code. It is small and
knows only the standard library: it is a demonstration, not an assistant.

## Training data

- The `.py` files of the Python {env["python"]} standard library that ran the trainer
  (`{d["stdlib"]}`, `site-packages` excluded): {d["train_files"]} training files,
  {d["train_bytes"] / 1e6:.1f} MB, plus {d["chat_examples"]} chat turns built from the docstrings and
  code of its public functions (user: the docstring's first paragraph; assistant: the function).
- Held out from both the tokenizer and the model, with their tests: {", ".join(f"`{m}`" for m in d["heldout_modules"])}
  ({d["heldout_files"]} files, {d["heldout_bytes"] / 1e3:.0f} kB, {d["heldout_tokens"]:,} tokens).
- License of the data: the Python Software Foundation License Version 2 (PSF-2.0),
  <https://docs.python.org/3/license.html>. These weights are derived from that text and are
  shared under the same terms.

## Model

`LlamaForCausalLM`: hidden {cfg.get("hidden_size")}, {cfg.get("num_hidden_layers")} layers, {cfg.get("num_attention_heads")} heads with
{cfg.get("num_key_value_heads")} KV heads (GQA), MLP {cfg.get("intermediate_size")}, vocabulary {cfg.get("vocab_size")}, context {cfg.get("max_position_embeddings")},
tied embeddings, {metrics["model"]["parameters"]:,} parameters, stored in bf16. The tokenizer is a
byte-level BPE trained on the training text with `tokenizers`; special tokens `<|endoftext|>`
(between files), `<|im_start|>`, `<|im_end|>` (end of a chat turn, the EOS token) and `<|pad|>`.
No BOS token is added to prompts. Generation stops at `<|im_end|>` or `<|endoftext|>`.

## Training

- Command: `{metrics["command"]}`
- Seed: {metrics["seed"]}. Hardware: {hardware}. Python {env["python"]}, torch {env["torch"]}
  (CUDA {env["cuda"]}), transformers {env["transformers"]}, tokenizers {env["tokenizers"]}.
  Commit: {env["commit"] or "not recorded"}.
- {t["steps"]} steps of {t["tokens_per_step"]:,} tokens ({t["epochs"]} epochs, {t["tokens_seen"] / 1e6:.1f}M tokens
  seen, {d["train_tokens"] / 1e6:.1f}M unique); AdamW (betas 0.9, 0.95, weight decay {a["weight_decay"]}),
  residual dropout {a["dropout"]}, {"bf16 autocast" if t["bf16_autocast"] else "fp32"}, torch.compile: {t["compiled"]}. The learning rate
  warms up over {a["warmup_steps"]} steps to {a["lr"]}, holds, and cools down (cosine, to {a["min_lr_ratio"]}x) from step
  {t["cooldown_start"]} ({t["cooldown_reason"]}); the run is bound by data, so the cool-down starts once
  held-out loss stops improving for {a["patience"]} evaluations ({a["evals_per_epoch"]} per epoch), if not sooner.
- The weights are those of the evaluation with the lowest held-out loss
  (step {t["best_step"]}{f", epoch {best['epoch']}" if best else ""}). Total run time {metrics["timings"]["total_s"] / 60:.1f} minutes.

## Evaluation (held-out modules)

| loss (nats/token) | perplexity | bits per byte |
|---|---|---|
| {h["loss"]:.4f} | {h["perplexity"]:.2f} | {h["bits_per_byte"]:.3f} |

Scored with the committed bf16 weights in fp32, over non-overlapping windows of
{cfg.get("max_position_embeddings")} tokens. The full curve is in `{METRICS_FILE}`.

## Samples

{_samples_section(metrics["samples"])}
## Use

```bash
pagoda serve e2e/demo-model            # or: make demo
```

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained("e2e/demo-model")
model = AutoModelForCausalLM.from_pretrained("e2e/demo-model")
ids = tok("def fibonacci(n):", return_tensors="pt").input_ids
print(tok.decode(model.generate(ids, max_new_tokens=64)[0]))
```
"""
    (out / "README.md").write_text(card)
