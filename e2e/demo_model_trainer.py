"""The demo model's training loop: batches, learning-rate schedule, held-out evaluation.

The standard library is only ~10M tokens, so the run is bound by data, not by the GPU: the model
sees the same text for many epochs and would start to memorise it at an epoch nobody can
predict. Three things follow from that. Residual dropout regularises. The learning rate holds at
its peak after warm-up and cools down (a cosine to near zero) once held-out loss stops improving,
or when the epoch cap or the clock leaves only the cool-down's share of the run. And the weights
kept are those with the best held-out loss.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

MIN_DELTA = 1e-3  # nats: a smaller gain in held-out loss is no improvement


def add_residual_dropout(model, p: float) -> list:
    """GPT-2-style dropout on every attention and MLP output, as forward hooks, so that the saved
    model stays a plain Llama."""
    if p <= 0:
        return []

    def on_attn(module, inputs, output):
        return (F.dropout(output[0], p, module.training), *output[1:])

    def on_mlp(module, inputs, output):
        return F.dropout(output, p, module.training)

    hooks = []
    for layer in model.model.layers:
        hooks.append(layer.self_attn.register_forward_hook(on_attn))
        hooks.append(layer.mlp.register_forward_hook(on_mlp))
    return hooks


@dataclass(slots=True)
class Schedule:
    """Warm-up, a constant peak, then a cosine cool-down over the last `cooldown_frac` of the run."""

    peak: float
    warmup: int
    min_ratio: float
    cooldown_frac: float
    end: int  # the last step as planned now
    cooldown_start: int | None = None  # set when the cool-down begins

    def planned_cooldown_start(self) -> int:
        return self.end - round(self.cooldown_frac * self.end)

    def lr(self, step: int) -> float:
        if step < self.warmup:
            return self.peak * (step + 1) / self.warmup
        start = self.cooldown_start if self.cooldown_start is not None else self.planned_cooldown_start()
        if step < start:
            return self.peak
        progress = min(1.0, (step - start) / max(1, self.end - start))
        return self.peak * (self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))

    def cool_down_from(self, step: int) -> None:
        """Held-out loss has stopped improving: anneal now, over the cool-down's share of the run."""
        if self.cooldown_start is None and step < self.planned_cooldown_start():
            self.cooldown_start = step
            self.end = step + max(1, round(step * self.cooldown_frac / (1 - self.cooldown_frac)))

    def shorten_to(self, end: int) -> None:
        self.end = min(self.end, end)  # a cool-down under way is compressed to fit


class Batches:
    """Epochs of non-overlapping windows at a fresh random offset, in a shuffled order."""

    def __init__(self, stream: torch.Tensor, seq_len: int, batch_size: int, seed: int):
        self.stream, self.seq_len, self.batch_size = stream, seq_len, batch_size
        self.gen = torch.Generator().manual_seed(seed)
        self.windows_per_epoch = (len(stream) - 1 - seq_len) // seq_len
        self.steps_per_epoch = self.windows_per_epoch // batch_size
        if self.steps_per_epoch < 1:
            raise SystemExit(
                f"{len(stream):,} training tokens do not fill one batch of {batch_size}x{seq_len}"
            )
        self.order = torch.empty(0, dtype=torch.long)
        self.offsets = torch.arange(seq_len + 1, device=stream.device)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if len(self.order) < self.batch_size:
            shift = int(torch.randint(self.seq_len, (1,), generator=self.gen))
            starts = shift + self.seq_len * torch.randperm(self.windows_per_epoch, generator=self.gen)
            self.order = starts[: self.steps_per_epoch * self.batch_size]
        starts, self.order = self.order[: self.batch_size], self.order[self.batch_size :]
        rows = self.stream[starts.to(self.stream.device)[:, None] + self.offsets]
        return rows[:, :-1], rows[:, 1:]


@torch.no_grad()
def evaluate(model, stream: torch.Tensor, seq_len: int, batch_size: int, autocast: bool, limit=None) -> float:
    """Mean next-token loss (nats) over non-overlapping windows of the held-out stream."""
    model.eval()
    n = (len(stream) - 1) // seq_len
    if limit:
        n = min(n, limit)
    windows = [stream[i * seq_len : (i + 1) * seq_len + 1] for i in range(n)]
    rest = stream[n * seq_len :]
    if limit is None and len(rest) > 1:
        windows.append(rest)  # the tail: every held-out token but the first of a window is scored
    total, count = 0.0, 0
    with torch.autocast(stream.device.type, torch.bfloat16, enabled=autocast):
        for i in range(0, len(windows), batch_size):
            group = windows[i : i + batch_size]
            same_length = len({len(w) for w in group}) == 1
            for chunk in [torch.stack(group)] if same_length else [w[None] for w in group]:
                logits = model(input_ids=chunk[:, :-1]).logits.float()
                loss = F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum")
                total, count = total + loss.item(), count + chunk[:, 1:].numel()
    model.train()
    return total / count


class Trainer:
    def __init__(self, args, model, batches: Batches, heldout: torch.Tensor, device, t0: float):
        self.args, self.model, self.batches, self.heldout, self.t0 = args, model, batches, heldout, t0
        self.bf16 = device.type == "cuda"
        decay = [p for p in model.parameters() if p.dim() >= 2]
        rest = [p for p in model.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": rest, "weight_decay": 0.0}]
        self.opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=self.bf16)
        self.compiled = args.compile == "on" or (args.compile == "auto" and device.type == "cuda")
        self.step_loss = torch.compile(self.loss) if self.compiled else self.loss
        max_steps = max(1, int(args.epochs * batches.steps_per_epoch))
        self.schedule = Schedule(args.lr, args.warmup_steps, args.min_lr_ratio, args.cooldown_frac, max_steps)
        self.eval_every = max(1, batches.steps_per_epoch // args.evals_per_epoch)
        self.eval_limit = 16 if args.tiny else None  # windows; the whole held-out set on the GPU
        self.history: list[dict] = []
        self.best = {"loss": float("inf"), "step": -1, "state": None}
        self.evals_since_best = 0
        self.step, self.eval_s, self.train_s = 0, 0.0, 0.0

    def loss(self, x, y):
        with torch.autocast(x.device.type, torch.bfloat16, enabled=self.bf16):
            logits = self.model(input_ids=x).logits
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    def train_step(self) -> torch.Tensor:
        for group in self.opt.param_groups:
            group["lr"] = self.schedule.lr(self.step)
        x, y = self.batches.next()
        try:
            loss = self.step_loss(x, y)
            loss.backward()  # inductor compiles the backward graph here, on the first call
        except Exception as exc:  # a torch.compile failure must not cost the run
            if not self.compiled:
                raise
            print(f"torch.compile failed ({type(exc).__name__}: {exc}); training eagerly", flush=True)
            self.opt.zero_grad(set_to_none=True)
            self.step_loss, self.compiled = self.loss, False
            loss = self.step_loss(x, y)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        return loss

    def fit_to_clock(self, per_step: float, stop_at: float) -> None:
        """Shorten the plan to the steps that fit before `stop_at`, at `per_step` seconds each."""
        self.schedule.shorten_to(self.step + int((stop_at - time.monotonic()) / per_step * 0.95))

    def evaluate_and_keep_best(self, loss: torch.Tensor) -> None:
        t = time.monotonic()
        heldout = evaluate(self.model, self.heldout, self.args.seq_len, 32, self.bf16, self.eval_limit)
        self.eval_s += time.monotonic() - t
        entry = {
            "step": self.step,
            "epoch": round(self.step / self.batches.steps_per_epoch, 2),
            "train_loss": round(loss.item(), 4),
            "heldout_loss": round(heldout, 4),
            "lr": self.opt.param_groups[0]["lr"],
            "elapsed_s": round(time.monotonic() - self.t0, 1),
        }
        self.history.append(entry)
        print(json.dumps(entry), flush=True)
        if heldout < self.best["loss"] - MIN_DELTA:
            self.evals_since_best = 0
        else:
            self.evals_since_best += 1
        if heldout < self.best["loss"]:
            state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            self.best = {"loss": heldout, "step": self.step, "state": state}
        if self.evals_since_best >= self.args.patience and self.step > self.schedule.warmup:
            self.schedule.cool_down_from(self.step)

    def train(self, stop_at: float) -> None:
        t_start, t_measure, loss = time.monotonic(), None, None
        while self.step < self.schedule.end and time.monotonic() < stop_at:
            loss = self.train_step()
            if self.step in (10, 40) and torch.cuda.is_available():
                torch.cuda.synchronize()  # time the GPU's work, not the queueing of it
            if self.step == 10:
                t_measure = time.monotonic()
            elif self.step == 40:  # steps 10..40 give the speed once compiled
                self.fit_to_clock((time.monotonic() - t_measure) / 30, stop_at)
                self.report_plan()
            if self.step % self.eval_every == 0 or self.step == self.schedule.end:
                self.evaluate_and_keep_best(loss)
            if self.step > 40 and self.step % 25 == 0:  # the average so far includes evaluations
                self.fit_to_clock((time.monotonic() - t_measure) / (self.step - 10), stop_at)
        if loss is not None and (not self.history or self.history[-1]["step"] != self.step):
            self.evaluate_and_keep_best(loss)  # the clock stopped training between evaluations
        self.train_s = time.monotonic() - t_start
        if self.best["state"] is not None:
            self.model.load_state_dict(self.best["state"])

    def report_plan(self) -> None:
        s = self.schedule
        print(
            f"plan: {s.end} steps ({s.end / self.batches.steps_per_epoch:.1f} epochs), cool-down from step "
            f"{s.cooldown_start if s.cooldown_start is not None else s.planned_cooldown_start()} at the latest",
            flush=True,
        )

    def summary(self) -> dict:
        s = self.schedule
        tokens_per_step = self.args.batch_size * self.args.seq_len
        return {
            "steps": self.step,
            "steps_per_epoch": self.batches.steps_per_epoch,
            "epochs": round(self.step / self.batches.steps_per_epoch, 2),
            "tokens_per_step": tokens_per_step,
            "tokens_seen": self.step * tokens_per_step,
            "cooldown_start": s.cooldown_start
            if s.cooldown_start is not None
            else s.planned_cooldown_start(),
            "cooldown_reason": "held-out plateau" if s.cooldown_start is not None else "epoch cap or clock",
            "compiled": self.compiled,
            "bf16_autocast": self.bf16,
            "best_step": self.best["step"],
            "train_s": round(self.train_s, 1),
            "eval_during_train_s": round(self.eval_s, 1),
            "history": self.history,
        }
