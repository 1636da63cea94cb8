"""ModelRunner: owns the model and its KV cache, and turns a SchedulerOutput into sampled tokens.

Per step it flattens the scheduled requests into one batch (input_ids, positions, slot_mapping,
block_tables, seq_lens, query_start_loc), runs the model under the attention context, computes
logits only for rows that end a request's known tokens (plus prompt rows asked for prompt
logprobs), and samples. Tensors are built on the host and copied once; a CUDA-graph path will
replace that with persistent buffers without changing this interface.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from pagoda.runtime.attention_context import AttentionContext, attention_context
from pagoda.runtime.kv.kv_cache_manager import KVCacheManager
from pagoda.runtime.model_config import ModelConfig
from pagoda.runtime.model_loader import TORCH_DTYPES, load_model
from pagoda.runtime.request import Request
from pagoda.runtime.sampler import Sampler, TokenLogprobs, gather_logprobs
from pagoda.runtime.scheduler import SchedulerOutput

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class ModelRunnerOutput:
    sampled: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    prompt_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)


class ModelRunner:
    def __init__(self, model_config: ModelConfig, device: torch.device, load_format: str, seed: int):
        self.model_config = model_config
        self.device = device
        self.dtype = TORCH_DTYPES[model_config.dtype]
        torch.manual_seed(seed)
        self.model = load_model(model_config, device, load_format, seed)
        self.sampler = Sampler(model_config.vocab_size, device, seed)
        self.kv_cache: torch.Tensor | None = None
        self.block_size = 16

    def weight_bytes(self) -> int:
        seen, total = set(), 0
        for p in self.model.parameters():
            if p.data_ptr() not in seen:
                seen.add(p.data_ptr())
                total += p.numel() * p.element_size()
        return total

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        cfg = self.model_config
        layers = self.model.attention_layers()
        kv_heads = layers[0].num_kv_heads
        shape = (2, len(layers), num_blocks, block_size, kv_heads, cfg.head_dim)
        self.kv_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.block_size = block_size
        for i, layer in enumerate(layers):
            layer.k_cache, layer.v_cache = self.kv_cache[0, i], self.kv_cache[1, i]

    @torch.inference_mode()
    def profile_peak_activation_bytes(self, num_tokens: int, max_model_len: int) -> int:
        """Run one forward of num_tokens (in sequences of at most max_model_len) on a scratch KV
        cache, and return the peak memory it needed beyond the weights and that cache."""
        if self.device.type != "cuda":
            return 0
        seq_len = min(num_tokens, max_model_len)
        num_seqs = -(-num_tokens // seq_len)
        blocks_per_seq = -(-seq_len // 16)
        self.allocate_kv_cache(num_seqs * blocks_per_seq, 16)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        ids = torch.zeros(num_seqs * seq_len, dtype=torch.long, device=self.device)
        positions = torch.arange(seq_len, device=self.device).repeat(num_seqs)
        tables = torch.arange(num_seqs * blocks_per_seq, dtype=torch.int32, device=self.device)
        ctx = AttentionContext(
            slot_mapping=torch.arange(num_seqs * seq_len, device=self.device)
            .view(num_seqs, seq_len)
            .add(torch.arange(num_seqs, device=self.device)[:, None] * (blocks_per_seq * 16 - seq_len))
            .flatten(),
            block_tables=tables.view(num_seqs, blocks_per_seq),
            seq_lens=torch.full((num_seqs,), seq_len, dtype=torch.int32, device=self.device),
            query_start_loc=torch.arange(0, num_seqs + 1, dtype=torch.int32, device=self.device) * seq_len,
            max_query_len=seq_len,
            max_seq_len=seq_len,
        )
        with attention_context(ctx):
            hidden = self.model(ids, positions)
            self.model.compute_logits(hidden[-num_seqs:])
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        self.kv_cache = None
        for layer in self.model.attention_layers():
            layer.k_cache = layer.v_cache = torch.empty(0)
        torch.cuda.empty_cache()
        return int(peak)

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput, kv: KVCacheManager) -> ModelRunnerOutput:
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slot_mapping: list[int] = []
        tables: list[list[int]] = []
        seq_lens: list[int] = []
        query_start_loc = [0]
        logits_rows: list[int] = []
        to_sample: list[Request] = []
        prompt_rows: list[tuple[Request, int, int, int]] = []  # request, first row, target token span
        for item in sched.scheduled:
            r, start = item.request, item.request.num_computed_tokens
            end = start + item.num_tokens
            block_ids = kv.get_block_ids(r.request_id)
            input_ids += r.token_ids_slice(start, end)
            positions += range(start, end)
            slot_mapping += [block_ids[p // bs] * bs + p % bs for p in range(start, end)]
            tables.append(block_ids)
            seq_lens.append(end)
            row0 = query_start_loc[-1]
            query_start_loc.append(row0 + item.num_tokens)
            if end == r.num_tokens:
                logits_rows.append(query_start_loc[-1] - 1)
                to_sample.append(r)
            if r.wants_prompt_logprobs:
                # Row p predicts prompt token p + 1; take the ones not reported yet.
                first = max(start + 1, 1 + len(r.prompt_logprobs))
                last = min(end + 1, r.num_prompt_tokens)
                if first < last:
                    prompt_rows.append((r, row0 + first - 1 - start, first, last))

        dev = self.device
        width = max(len(t) for t in tables)
        block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
        ctx = AttentionContext(
            slot_mapping=torch.tensor(slot_mapping, dtype=torch.long).to(dev, non_blocking=True),
            block_tables=block_tables.to(dev, non_blocking=True),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32).to(dev, non_blocking=True),
            query_start_loc=torch.tensor(query_start_loc, dtype=torch.int32).to(dev, non_blocking=True),
            max_query_len=max(s.num_tokens for s in sched.scheduled),
            max_seq_len=max(seq_lens),
        )
        ids = torch.tensor(input_ids, dtype=torch.long).to(dev, non_blocking=True)
        pos = torch.tensor(positions, dtype=torch.long).to(dev, non_blocking=True)
        with attention_context(ctx):
            hidden = self.model(ids, pos)

        out = ModelRunnerOutput()
        if to_sample:
            logits = self.model.compute_logits(hidden[torch.tensor(logits_rows, device=dev)])
            sampled = self.sampler(logits, to_sample)
            for r, token, lp in zip(to_sample, sampled.token_ids, sampled.logprobs):
                out.sampled[r.request_id] = token
                if lp is not None:
                    out.logprobs[r.request_id] = lp
        for r, row, first, last in prompt_rows:
            out.prompt_logprobs[r.request_id] = self._prompt_logprobs(hidden, r, row, first, last)
        return out

    def _prompt_logprobs(
        self, hidden: torch.Tensor, r: Request, row: int, first: int, last: int
    ) -> list[TokenLogprobs]:
        targets = r.prompt_token_ids[first:last]
        logits = self.model.compute_logits(hidden[row : row + len(targets)]).float()
        ids = torch.tensor(targets, device=logits.device)
        k = r.sampling_params.prompt_logprobs
        return gather_logprobs(torch.log_softmax(logits, dim=-1), ids, [k] * len(targets))
