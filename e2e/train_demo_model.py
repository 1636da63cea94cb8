"""Train Pagoda's embedded demo model: a ~11M-parameter Llama on the Python standard library.

    python3 e2e/train_demo_model.py --out $OUT/demo-model --minutes 8

No model hub is reachable from our machines, so the demo and quality-test model is made here, in
the open: the training text is the stdlib source of the interpreter running this script, the
tokenizer is a byte-level BPE trained on that text, and the model is transformers' own
LlamaForCausalLM, so the checkpoint loads with AutoModelForCausalLM. `--minutes` bounds the whole
run (data, tokenizer, compile, training, evaluation, saving); `--tiny` is a CPU smoke run.

The stdlib is only ~10M tokens, so the run is bound by data, not by the GPU; demo_model_trainer.py
says how the schedule copes with that.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from pathlib import Path

import demo_model_card
import demo_model_data as data
import torch
from demo_model_trainer import Batches, Trainer, add_residual_dropout, evaluate

PROMPTS = ["def fibonacci(n):", "class Stack:", "import os\n\ndef "]
CHAT_PROMPT = "Write a Python function that returns the n-th Fibonacci number."
TINY = dict(
    vocab_size=1024,
    hidden_size=64,
    intermediate_size=128,
    layers=2,
    heads=4,
    kv_heads=2,
    seq_len=128,
    batch_size=8,
    warmup_steps=10,
)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for the Hugging Face checkpoint")
    p.add_argument("--minutes", type=float, default=8.0, help="wall-clock budget for the whole run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny", action="store_true", help="toy model and data subset, for a CPU smoke run")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--hidden-size", type=int, default=384)
    p.add_argument("--intermediate-size", type=int, default=768)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=1024, help="training context = max_position_embeddings")
    p.add_argument("--batch-size", type=int, default=64, help="sequences per step")
    p.add_argument(
        "--epochs", type=float, default=32, help="at most; a held-out plateau or the clock ends sooner"
    )
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    p.add_argument(
        "--min-lr-ratio", type=float, default=0.02, help="end of the cool-down, as a share of the peak"
    )
    p.add_argument("--warmup-steps", type=int, default=200)
    p.add_argument("--cooldown-frac", type=float, default=0.2, help="share of the run spent cooling down")
    p.add_argument("--evals-per-epoch", type=int, default=4)
    p.add_argument("--patience", type=int, default=4, help="evaluations without gain before cooling down")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--dropout", type=float, default=0.1, help="on each attention and MLP output")
    p.add_argument("--compile", choices=["auto", "on", "off"], default="auto", help="auto: on for CUDA")
    p.add_argument("--max-size-mb", type=float, default=25.0, help="fail if the checkpoint folder is larger")
    if "--tiny" in (sys.argv[1:] if argv is None else argv):
        p.set_defaults(**TINY)  # flags given explicitly still win
    return p.parse_args(argv)


def build_model(args, tokenizer, device):
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    eot = tokenizer.convert_tokens_to_ids(data.ENDOFTEXT)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.seq_len,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,  # 3M parameters saved: the 25 MB budget buys depth instead
        bos_token_id=eot,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config).to(device)
    model.generation_config = GenerationConfig(
        bos_token_id=eot, eos_token_id=[tokenizer.eos_token_id, eot], pad_token_id=tokenizer.pad_token_id
    )
    return model


@torch.no_grad()
def samples(model, tokenizer, device, max_new_tokens: int, seed: int) -> list[dict]:
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": CHAT_PROMPT}], tokenize=False, add_generation_prompt=True
    )
    out = []
    for kind, prompt in [("completion", p) for p in PROMPTS] + [("chat", chat)]:
        ids = torch.tensor([tokenizer(prompt, add_special_tokens=False).input_ids], device=device)
        for mode in ("greedy", "sampled"):
            torch.manual_seed(seed)
            kwargs = {"temperature": 0.8, "top_p": 0.95} if mode == "sampled" else {}
            gen = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=mode == "sampled", **kwargs)
            text = tokenizer.decode(gen[0, ids.shape[1] :], skip_special_tokens=True)
            user = {"user": CHAT_PROMPT} if kind == "chat" else {}
            out.append({"kind": kind, "mode": mode, "prompt": prompt, **user, "completion": text, **kwargs})
    return out


def main(argv=None) -> int:
    t0 = time.monotonic()
    args = parse_args(argv)
    # Final evaluation, samples and saving take well under a minute on the GPU.
    stop_training_at = t0 + args.minutes * 60 - min(45.0, 0.12 * args.minutes * 60)
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    corpus = data.load_corpus(limit_files=60 if args.tiny else None)
    chats = data.chat_examples(corpus, args.seed)
    train_docs = list(corpus.train.values()) + chats
    tokenizer = data.train_tokenizer(train_docs, args.vocab_size)
    train_ids = data.encode_stream(tokenizer, train_docs, seed=args.seed)
    heldout_ids = data.encode_stream(tokenizer, list(corpus.heldout.values()), seed=None)
    heldout_bytes = sum(len(t.encode()) for t in corpus.heldout.values())
    data_s = time.monotonic() - t0
    print(
        f"data: {len(corpus.train)} train files, {len(chats)} chat examples, {len(train_ids):,} train "
        f"tokens, {len(heldout_ids):,} held-out tokens ({data_s:.0f}s)",
        flush=True,
    )

    model = build_model(args, tokenizer, device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params:,} parameters ({n_params * 2 / 1e6:.1f} MB in bf16)", flush=True)
    hooks = add_residual_dropout(model, args.dropout)
    model.train()
    batches = Batches(torch.tensor(train_ids, device=device), args.seq_len, args.batch_size, args.seed)
    heldout = torch.tensor(heldout_ids, device=device)
    trainer = Trainer(args, model, batches, heldout, device, t0)
    trainer.train(stop_training_at)
    for hook in hooks:
        hook.remove()

    # Report what is committed: bf16 weights, evaluated in fp32 as the CPU tests run them.
    model.to(torch.bfloat16).to(torch.float32).eval()
    final = evaluate(model, heldout, args.seq_len, 32, autocast=False, limit=trainer.eval_limit)
    samples_out = samples(model, tokenizer, device, 24 if args.tiny else 96, args.seed)
    out = Path(args.out)
    model.to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    demo_model_card.inline_chat_template(out)
    metrics = {
        "command": shlex.join(["python3", *sys.argv]),
        "seed": args.seed,
        "args": vars(args),
        "environment": demo_model_card.environment(device),
        "data": {
            **corpus.stats(),
            "chat_examples": len(chats),
            "train_tokens": len(train_ids),
            "heldout_tokens": len(heldout_ids),
        },
        "model": {"parameters": n_params, "config": model.config.to_diff_dict()},
        "training": trainer.summary(),
        "heldout": {
            "loss": final,
            "perplexity": math.exp(final),
            "bits_per_byte": final * len(heldout_ids) / heldout_bytes / math.log(2),
            "scored_with": "the bf16 weights in fp32, non-overlapping windows of seq_len tokens",
        },
        "samples": samples_out,
        "timings": {"data_s": round(data_s, 1), "total_s": round(time.monotonic() - t0, 1)},
    }
    demo_model_card.write(out, metrics)
    for path in out.iterdir():
        path.chmod(0o644)  # safetensors writes 0600; images that run as non-root must read it
    size_mb = sum(f.stat().st_size for f in out.iterdir()) / 1e6
    print(
        f"held-out loss {final:.4f}, perplexity {math.exp(final):.2f}; {size_mb:.1f} MB in {out} "
        f"after {time.monotonic() - t0:.0f}s",
        flush=True,
    )
    if size_mb > args.max_size_mb:
        print(f"checkpoint is {size_mb:.1f} MB, over the {args.max_size_mb} MB budget", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
