"""Test group 2: seeded sampling, penalties, logprobs and stop conditions, as in vLLM."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from pagoda.runtime import LLM, SamplingParams

from .conftest import make_prompts


@pytest.fixture(scope="module")
def llama(tiny_models):
    return tiny_models["llama"]


@pytest.fixture(scope="module")
def llm(llama):
    return LLM(llama, block_size=8, max_model_len=256, device="cpu")


def gen(llm, prompts, params):
    if isinstance(prompts[0], str):
        return llm.generate(prompts, sampling_params=params, use_tqdm=False)
    return llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)


def test_seeded_sampling_is_independent_of_the_batch(llama, llm):
    prompts = make_prompts(seed=3)
    seeded = SamplingParams(temperature=0.9, top_p=0.95, top_k=100, seed=1234, max_tokens=12)
    alone = gen(llm, [prompts[5]], seeded)[0].outputs[0].token_ids

    other = SamplingParams(temperature=1.0, max_tokens=12)  # unseeded neighbours draw from the engine
    params = [other] * len(prompts)
    params[5] = seeded
    crowded = gen(llm, prompts, params)[5].outputs[0].token_ids

    small = LLM(
        llama,
        block_size=8,
        max_model_len=256,
        device="cpu",
        max_num_seqs=3,
        max_num_batched_tokens=16,
        seed=7,
    )
    chunked = gen(small, prompts, params)[5].outputs[0].token_ids
    assert alone == crowded == chunked
    assert len(alone) == 12


def test_unseeded_sampling_varies_and_n_children_differ(llm):
    prompt = make_prompts(seed=4)[10]
    params = SamplingParams(n=3, temperature=1.0, seed=99, max_tokens=8)
    first = gen(llm, [prompt], params)[0]
    again = gen(llm, [prompt], params)[0]
    assert [c.index for c in first.outputs] == [0, 1, 2]
    assert [c.token_ids for c in first.outputs] == [c.token_ids for c in again.outputs]
    assert len({tuple(c.token_ids) for c in first.outputs}) > 1
    # Child i uses seed + i, as vLLM V1 does: child 1 of seed 99 is child 0 of seed 100.
    shifted = gen(llm, [prompt], SamplingParams(temperature=1.0, seed=100, max_tokens=8))[0]
    assert shifted.outputs[0].token_ids == first.outputs[1].token_ids


def test_n_greedy_children_share_prompt_blocks(llama):
    for caching in (True, False):
        llm = LLM(llama, block_size=8, max_model_len=256, device="cpu", enable_prefix_caching=caching)
        engine = llm.llm_engine
        prompt = make_prompts(seed=5)[14]  # 64 tokens = 8 full blocks
        engine.add_request("r", None, prompt, SamplingParams(n=4, temperature=0.0, max_tokens=4))
        engine.step()  # child 0's prefill
        engine.step()  # siblings borrow its full prompt blocks
        tables = [engine.kv_cache_manager.get_block_ids(f"r#{i}") for i in range(4)]
        shared = (len(prompt) - 1) // 8
        assert all(t[:shared] == tables[0][:shared] for t in tables)
        assert engine.kv_cache_manager.block_pool.blocks[tables[0][0]].ref_cnt == 4
        outs = []
        while engine.has_unfinished_requests():
            outs += engine.step()
        final = outs[-1]
        assert final.finished and len({tuple(c.token_ids) for c in final.outputs}) == 1
        assert engine.kv_cache_manager.block_pool.num_free_blocks == engine.kv_cache_manager.num_blocks


def test_repetition_penalty_matches_transformers(llama, llm, hf):
    prompts = make_prompts(seed=6)[8:12]
    params = SamplingParams(temperature=0.0, repetition_penalty=1.5, max_tokens=10)
    got = [o.outputs[0].token_ids for o in gen(llm, prompts, params)]
    want = [hf.greedy(llama, p, repetition_penalty=1.5) for p in prompts]
    assert got == want


def test_logprobs_match_transformers(llama, llm, hf):
    prompt = make_prompts(seed=8)[12]
    out = gen(llm, [prompt], SamplingParams(temperature=0.0, max_tokens=4, logprobs=3, prompt_logprobs=2))[0]
    model = hf.model(llama)
    ids = torch.tensor([prompt + out.outputs[0].token_ids])
    with torch.no_grad():
        ref = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    n = len(prompt)
    for i, (tok, entry) in enumerate(zip(out.outputs[0].token_ids, out.outputs[0].logprobs)):
        row = ref[n - 1 + i]
        assert entry[tok].rank == 1  # greedy picks the top token
        assert entry[tok].logprob == pytest.approx(row[tok].item(), abs=1e-4)
        top = row.topk(3).indices.tolist()
        assert list(entry)[:3] == top or set(entry) == set(top)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == n
    for pos in range(1, n):
        entry = out.prompt_logprobs[pos]
        tok = prompt[pos]
        assert entry[tok].logprob == pytest.approx(ref[pos - 1, tok].item(), abs=1e-4)
        assert entry[tok].rank == int((ref[pos - 1] > ref[pos - 1, tok]).sum()) + 1
        assert len(entry) in (2, 3)


def test_top_k_top_p_keep_the_right_tokens():
    """Through the sampler the engine calls (pagoda.kernels.ops.sample): over many seeds, row 0
    (top_k=2) draws only its two best tokens, and row 1 (top_p=0.5) only its single best."""
    from pagoda.kernels import ops

    logits = torch.tensor([[3.0, 1.0, 2.0, 0.0], [0.0, 0.0, 5.0, 4.9]])
    drawn: list[set[int]] = [set(), set()]
    for seed in range(64):
        ids = ops.sample(
            logits,
            temperature=torch.tensor([1.0, 1.0]),
            top_k=torch.tensor([2, 4], dtype=torch.int32),
            top_p=torch.tensor([1.0, 0.5]),
            min_p=torch.tensor([0.0, 0.0]),
            seeds=torch.tensor([seed, seed]),
            steps=torch.tensor([0, 0]),
        )
        for row, token in enumerate(ids.tolist()):
            drawn[row].add(token)
    assert drawn == [{0, 2}, {2}]


def test_max_tokens_and_min_tokens(llm):
    prompts = make_prompts(seed=9)[:4]
    base = gen(llm, prompts, SamplingParams(temperature=0.0, max_tokens=12))
    for o in base:
        assert len(o.outputs[0].token_ids) == 12 and o.outputs[0].finish_reason == "length"
        assert o.outputs[0].stop_reason is None
    # A stop token at position 1 cannot end the sequence before min_tokens.
    first = base[0].outputs[0].token_ids
    stop_id = first[1]
    out = gen(
        llm,
        [prompts[0]],
        SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop_id], min_tokens=5),
    )[0]
    toks = out.outputs[0].token_ids
    assert stop_id not in toks[:5]
    assert len(toks) >= 5
    if toks[-1] == stop_id:
        assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop_id


def test_stop_token_ids(llm):
    prompt = make_prompts(seed=10)[9]
    full = gen(llm, [prompt], SamplingParams(temperature=0.0, max_tokens=12))[0].outputs[0].token_ids
    stop_id = full[4]
    cut = full.index(stop_id)
    out = gen(llm, [prompt], SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop_id]))[
        0
    ].outputs[0]
    assert out.token_ids == full[: cut + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop_id)
    tok = llm.get_tokenizer()
    assert out.text == tok.decode(full[:cut], skip_special_tokens=True)


def _printable_prompt(llm):
    # Text prompts decode back to clean characters, so stop strings are easy to pick.
    return "def schedule(self, request):\n    return self.kv_cache"


def test_stop_strings(llm):
    prompt = _printable_prompt(llm)
    full = gen(llm, [prompt], SamplingParams(temperature=0.0, max_tokens=16))[0].outputs[0]
    text = full.text
    clean = text.replace("\ufffd", "")
    assert len(clean) >= 6, text
    stop = clean[len(clean) // 2 : len(clean) // 2 + 2]
    index = text.find(stop)
    out = gen(llm, [prompt], SamplingParams(temperature=0.0, max_tokens=16, stop=[stop]))[0].outputs[0]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert out.text == text[:index]
    assert out.token_ids == full.token_ids[: len(out.token_ids)]
    inc = gen(
        llm,
        [prompt],
        SamplingParams(temperature=0.0, max_tokens=16, stop=stop, include_stop_str_in_output=True),
    )
    assert inc[0].outputs[0].text == text[: index + len(stop)]


def test_streamed_text_holds_back_partial_stop_strings(llm):
    engine = llm.llm_engine
    prompt = _printable_prompt(llm)
    params = SamplingParams(temperature=0.0, max_tokens=16, stop=["zzzzzz"])
    engine.add_request("s", prompt, llm.get_tokenizer().encode(prompt), params)
    texts = []
    while engine.has_unfinished_requests():
        for o in engine.step():
            texts.append((o.outputs[0].text, o.finished))
    final = texts[-1][0]
    for text, finished in texts[:-1]:
        assert final.startswith(text) and len(text) <= len(final) - len("zzzzz") or finished


def test_detokenizer_never_cuts_a_character(llm):
    from pagoda.runtime.frontend.detokenizer import IncrementalDetokenizer

    tok = llm.get_tokenizer()
    text = "héllo wörld 日本語 — ok"
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok, tok.encode("say:"), SamplingParams())
    seen = []
    for i in ids:
        detok.update([i], stop_terminated=False)
        seen.append(detok.get_text(finished=False))
    assert seen[-1] == text == tok.decode(ids)
    assert all("\ufffd" not in s for s in seen)
    assert len(set(seen)) < len(seen)  # some tokens were held back until their character completed


def test_ignore_eos(tiny_models, hf, tmp_path):
    """Make a token the model emits an EOS (generation_config.json's list), then ignore it."""
    src = tiny_models["qwen2"]
    path = tmp_path / "eos_model"
    shutil.copytree(src, path)
    prompt = make_prompts(seed=11)[11]
    llm = LLM(str(path), block_size=8, max_model_len=128, device="cpu")
    full = (
        gen(llm, [prompt], SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))[0]
        .outputs[0]
        .token_ids
    )
    eos = full[3]
    gen_cfg = json.loads((path / "generation_config.json").read_text())
    gen_cfg["eos_token_id"] = [gen_cfg["eos_token_id"], eos]
    (path / "generation_config.json").write_text(json.dumps(gen_cfg))

    llm = LLM(str(path), block_size=8, max_model_len=128, device="cpu")
    stopped = gen(llm, [prompt], SamplingParams(temperature=0.0, max_tokens=10))[0].outputs[0]
    assert stopped.token_ids == full[: full.index(eos) + 1]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == hf.greedy(str(path), prompt)  # transformers stops there too
    ignored = gen(llm, [prompt], SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))[0].outputs[
        0
    ]
    assert ignored.token_ids == full and ignored.finish_reason == "length"


@pytest.mark.parametrize(
    "field,value,allowed",
    [
        ("temperature", -0.1, "non-negative"),
        ("top_p", 0.0, "(0, 1]"),
        ("top_p", 1.5, "(0, 1]"),
        ("top_k", -2, "-1"),
        ("min_p", 1.5, "[0, 1]"),
        ("presence_penalty", 3.0, "[-2, 2]"),
        ("frequency_penalty", -2.5, "[-2, 2]"),
        ("repetition_penalty", 0.0, "(0, inf)"),
        ("n", 0, ">= 1"),
        ("max_tokens", 0, ">= 1"),
        ("min_tokens", -1, ">= 0"),
        ("logprobs", -1, ">= 0"),
    ],
)
def test_bad_sampling_params(field, value, allowed):
    with pytest.raises(ValueError) as err:
        SamplingParams(**{field: value})
    assert field in str(err.value) and allowed in str(err.value)


def test_min_tokens_above_max_tokens():
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=5, max_tokens=3)


@pytest.mark.parametrize("vocab", [128256, 151936, 32000, 1000, 4099])
@pytest.mark.parametrize("rows", [1, 3, 31, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_argmax_is_torch_argmax_ties_included(vocab, rows, dtype):
    from pagoda.runtime.worker.sampler import greedy_argmax

    gen = torch.Generator().manual_seed(vocab + rows)
    # Few distinct values, so most rows have their maximum many times: the first one must win.
    logits = torch.randint(-5, 6, (rows, vocab), generator=gen).to(dtype)
    logits[0, vocab // 2 + 1] = 7.0  # a lone maximum in a late chunk
    assert torch.equal(greedy_argmax(logits), logits.argmax(dim=-1))
