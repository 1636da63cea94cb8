"""Structured outputs through LLM.generate: JSON schema, regex, choice and EBNF outputs from a random
model always validate, with n > 1, stop strings, preemption and prefix caching, and a bad grammar is
a ValueError that leaves the engine serving."""

from __future__ import annotations

import json
import re
import threading

import jsonschema
import pytest

# pyproject's runtime extra installs xgrammar (CI has it); a venv built before it was added may not.
pytest.importorskip("xgrammar")

from pagoda.runtime import LLM, SamplingParams, StructuredOutputsParams
from pagoda.runtime.core import structured_outputs as core_so

from .conftest import CHOICES, PERSON, REGEX

SEEDS = range(12)


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(tiny_llama, device="cpu", max_model_len=512, block_size=8)


def _so(**kw) -> StructuredOutputsParams:
    return StructuredOutputsParams(**kw)


def _run(llm, prompts, params):
    return llm.generate(prompts, params, use_tqdm=False)


def test_json_schema_outputs_validate_over_seeds(llm):
    so = _so(json=PERSON, disable_any_whitespace=True)
    outs = _run(llm, ["hello"] * len(SEEDS),
                [SamplingParams(temperature=1.0, seed=s, max_tokens=120, structured_outputs=so) for s in SEEDS])
    texts = set()
    for o in outs:
        c = o.outputs[0]
        assert c.finish_reason == "stop", c.text
        jsonschema.validate(json.loads(c.text), PERSON)
        texts.add(c.text)
    assert len(texts) > 1  # the seeds differ: the schema, not a fixed string, is what they share


def test_unconstrained_model_writes_no_json(llm):
    """The control: without the grammar, the same requests are not valid JSON."""
    outs = _run(llm, ["hello"] * 4, [SamplingParams(temperature=1.0, seed=s, max_tokens=40) for s in range(4)])
    for o in outs:
        with pytest.raises(ValueError):
            json.loads(o.outputs[0].text)


def test_regex_and_choice_outputs_match_over_seeds(llm):
    regex = [SamplingParams(temperature=1.0, seed=s, max_tokens=40, structured_outputs=_so(regex=REGEX))
             for s in SEEDS]
    choice = [SamplingParams(temperature=1.0, seed=s, max_tokens=40, structured_outputs=_so(choice=CHOICES))
              for s in SEEDS]
    outs = _run(llm, ["a"] * (2 * len(SEEDS)), regex + choice)
    for o in outs[: len(SEEDS)]:
        assert re.fullmatch(REGEX, o.outputs[0].text), o.outputs[0].text
        assert o.outputs[0].finish_reason == "stop"
    assert {o.outputs[0].text for o in outs[len(SEEDS):]} <= set(CHOICES)


def test_ebnf_and_lark_grammars(llm):
    ebnf = 'root ::= "(" num ("+" num){0,3} ")"\nnum ::= [0-9]{1,3}'
    lark = 'start: "<" WORD ">"\nWORD: /[xyz]{1,4}/'
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=40, structured_outputs=_so(grammar=g))
              for s in range(6) for g in (ebnf, lark)]
    outs = _run(llm, ["b"] * len(params), params)
    for i, o in enumerate(outs):
        pattern = r"\(\d{1,3}(\+\d{1,3}){0,3}\)" if i % 2 == 0 else r"<[xyz]{1,4}>"
        assert re.fullmatch(pattern, o.outputs[0].text), o.outputs[0].text


def test_n_children_each_follow_the_grammar(llm):
    (out,) = _run(llm, ["x"], SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=40,
                                             structured_outputs=_so(regex=REGEX)))
    assert len(out.outputs) == 4
    assert all(re.fullmatch(REGEX, c.text) for c in out.outputs)
    assert len({c.text for c in out.outputs}) > 1


def test_mixed_batch_leaves_unconstrained_requests_alone(llm):
    plain = [SamplingParams(temperature=0, max_tokens=12) for _ in range(3)]
    alone = [o.outputs[0].token_ids for o in _run(llm, ["p1", "p2", "p3"], plain)]
    mixed = _run(llm, ["p1", "s", "p2", "s", "p3"],
                 [plain[0], SamplingParams(temperature=0, max_tokens=40, structured_outputs=_so(regex=REGEX)),
                  plain[1], SamplingParams(temperature=0, max_tokens=40, structured_outputs=_so(choice=CHOICES)),
                  plain[2]])
    assert [mixed[i].outputs[0].token_ids for i in (0, 2, 4)] == alone
    assert re.fullmatch(REGEX, mixed[1].outputs[0].text)
    assert mixed[3].outputs[0].text in CHOICES


def test_stop_string_cuts_the_structured_text(llm):
    so = _so(json=PERSON, disable_any_whitespace=True)
    (out,) = _run(llm, ["q"], SamplingParams(temperature=0, max_tokens=120, stop=['"age"'], structured_outputs=so))
    c = out.outputs[0]
    assert c.finish_reason == "stop" and c.stop_reason == '"age"'
    assert c.text.startswith('{"name": "') and c.text.endswith(", ")


def test_grammar_end_stops_even_with_ignore_eos(llm):
    (out,) = _run(llm, ["q"], SamplingParams(temperature=0, max_tokens=60, ignore_eos=True,
                                             structured_outputs=_so(choice=["done"])))
    c = out.outputs[0]
    assert c.text == "done" and c.finish_reason == "stop"
    assert len(c.token_ids) < 60


def test_preemption_and_prefix_cache_keep_the_grammar(llm, tiny_llama):
    """A pool too small for the batch preempts requests mid-grammar: recomputed, their matchers
    continue from the tokens they kept, and greedy outputs equal a roomy run's."""
    so = _so(json=PERSON, disable_any_whitespace=True)
    prompts = [f"prompt number {i} " * 6 for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=120, structured_outputs=so)
    roomy = llm  # the module's engine: its pool holds the whole batch
    want = [o.outputs[0].text for o in _run(roomy, prompts, params)]
    again = _run(roomy, prompts, params)  # every prompt's blocks are cached now
    assert [o.outputs[0].text for o in again] == want
    assert all(o.num_cached_tokens > 0 for o in again)
    tight = LLM(tiny_llama, device="cpu", max_model_len=256, block_size=8, num_kv_blocks=40)
    got = [o.outputs[0].text for o in _run(tight, prompts, params)]
    assert tight.llm_engine.scheduler.num_preemptions > 0
    assert got == want
    for text in got:
        jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.parametrize("so, field, message", [
    (dict(json={"type": "object", "properties": {"a": {"type": "nope"}}}), "structured_outputs",
     'Unsupported type "nope"'),
    (dict(json="{not json"), "structured_outputs", "not JSON"),
    (dict(regex="a(b"), "structured_outputs", "parenthesis is not closed"),
    (dict(grammar="root ::= foo"), "structured_outputs", 'Rule "foo" is not defined'),
])
def test_bad_grammar_is_a_value_error_and_the_engine_goes_on(llm, so, field, message):
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        _run(llm, ["z"], SamplingParams(max_tokens=5, structured_outputs=_so(**so)))
    assert str(info.value).startswith(field)
    assert not llm.llm_engine.has_unfinished_requests()
    (out,) = _run(llm, ["z"], SamplingParams(temperature=0, max_tokens=20, structured_outputs=_so(choice=["ok"])))
    assert out.outputs[0].text == "ok"


def test_exactly_one_kind():
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(json={}, regex="a")
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()


def test_request_waits_for_its_grammar_without_a_seat(tiny_llama, monkeypatch):
    """One seat: a request whose grammar is still compiling stays waiting, holding no seat and no
    block, while the request behind it runs; once compiled, it runs too."""
    gate = threading.Event()
    compile_grammar = core_so.compile_grammar

    def slow_compile(compiler, key):
        assert gate.wait(timeout=60)
        return compile_grammar(compiler, key)

    monkeypatch.setattr(core_so, "compile_grammar", slow_compile)
    engine = LLM(tiny_llama, device="cpu", max_model_len=256, max_num_seqs=1).llm_engine
    tok = engine.tokenizer
    engine.add_request("s", None, tok.encode("s"), SamplingParams(temperature=0, max_tokens=30,
                                                                  structured_outputs=_so(regex="[ab]{4}")))
    engine.add_request("p", None, tok.encode("p"), SamplingParams(temperature=0, max_tokens=5))
    done = {}
    while "p" not in done:
        done.update({o.request_id: o for o in engine.step() if o.finished})
    waiting = engine.scheduler.requests["s"]
    assert waiting is not None and not waiting.num_computed_tokens
    assert engine.kv_cache_manager.req_to_blocks.get("s") in (None, [])
    gate.set()
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    assert re.fullmatch("[ab]{4}", done["s"].outputs[0].text)


def test_async_scheduling_defers_sampling_and_matches_sync(tiny_llama, monkeypatch):
    """Scheduled ahead, a step with grammars runs its forward at once and samples once the step
    before is read: the tokens equal a synchronous run's, seeded sampling included."""
    from pagoda.runtime.core.scheduler import Scheduler

    deferred = []
    schedule_ahead = Scheduler.schedule_ahead

    def spy(self, current):
        nxt = schedule_ahead(self, current)
        if nxt is not None and nxt.defer_sampling:
            deferred.append(len(nxt.scheduled))
        return nxt

    monkeypatch.setattr(Scheduler, "schedule_ahead", spy)
    so = _so(json=PERSON, disable_any_whitespace=True)
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=120, structured_outputs=so) for s in range(4)]
    params.append(SamplingParams(temperature=1.0, seed=9, max_tokens=30))  # no grammar, same batch
    prompts = ["a", "b", "c", "d", "e"]
    outs = {}
    for mode in (False, True):
        llm = LLM(tiny_llama, device="cpu", max_model_len=256, async_scheduling=mode)
        outs[mode] = [o.outputs[0].token_ids for o in _run(llm, prompts, params)]
    assert deferred  # the async run did schedule grammar steps ahead
    assert outs[True] == outs[False]
    for o in outs[True][:4]:
        jsonschema.validate(json.loads(llm.get_tokenizer().decode(o, skip_special_tokens=True)), PERSON)
