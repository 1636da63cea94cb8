"""Structured outputs in the engine core: grammars compiled off the step loop, one matcher each.

vLLM V1's StructuredOutputManager, on xgrammar. A request with structured_outputs gets a
RequestGrammar when it arrives; its grammar compiles in a worker thread, through a cache keyed by
(kind, spec), so a thousand requests with one schema compile it once. Until the grammar is ready
the request stays in the waiting queue and holds no seat and no KV block (Scheduler skips it).
Then each step the sampler fills the request's row of a token bitmask from its matcher and masks
the logits on the device; the scheduler feeds the sampled token back to the matcher, and a matcher
that has terminated (it accepted a stop token at the end of the grammar) ends the request "stop".
With async scheduling, a decode step with grammars is still launched ahead, but only its forward
pass: its sampling is enqueued once the step before is read and its tokens are in the matchers
(SchedulerOutput.defer_sampling), so the host's bitmask work overlaps the GPU's forward pass.

The core holds no tokenizer: the frontend hands it xgrammar's TokenizerInfo, serialized, before
the first structured request (init). A preempted request keeps its output tokens, and its matcher
has accepted exactly those; `sync` replays whatever it has not seen, so the two never drift.
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field

from pagoda.runtime.structured_outputs_params import StructuredOutputsParams

logger = logging.getLogger(__name__)

CACHE_ENTRIES = 1024  # compiled grammars kept (xgrammar's own cache is bounded by bytes too)
_XGR_PREFIX = re.compile(r"^\[[\d:]+\] \S+?:\d+: ")


def parser_message(exc: BaseException) -> str:
    """xgrammar's error without its log prefix ("[14:25:34] /project/cpp/x.cc:83: ")."""
    return _XGR_PREFIX.sub("", str(exc).strip())


def choice_as_ebnf(choices: list[str]) -> str:
    """One alternative per choice, each a JSON-escaped literal (EBNF strings take JSON escapes)."""
    import json

    return "root ::= " + " | ".join(json.dumps(c) for c in choices)


def compile_grammar(compiler, key: tuple[str, str]):
    kind, spec = key
    base, _, compact = kind.partition(":")
    any_whitespace = not compact
    if base == "json":
        return compiler.compile_json_schema(spec, any_whitespace=any_whitespace)
    if base == "json_object":
        return compiler.compile_json_schema('{"type": "object"}', any_whitespace=any_whitespace)
    if base == "regex":
        return compiler.compile_regex(spec)
    if base == "choice":
        import json

        return compiler.compile_grammar(choice_as_ebnf(json.loads(spec)))
    if base == "grammar":
        if looks_like_lark(spec):
            return compiler.compile_lark(spec)
        return compiler.compile_grammar(spec)
    if base == "structural_tag":
        return compiler.compile_structural_tag(spec)
    raise ValueError(f"unknown structured output kind {kind!r}")


def looks_like_lark(grammar: str) -> bool:
    """EBNF (GBNF) rules read `name ::= ...`; Lark's read `name: ...`."""
    return "::=" not in grammar


@dataclass(slots=True, eq=False)
class RequestGrammar:
    """One request's grammar: the compile it waits on, then its own matcher."""

    key: tuple[str, str]
    future: Future
    stop_token_ids: list[int]
    matcher: object | None = None
    num_accepted: int = 0  # output tokens the matcher has accepted
    terminated: bool = False
    error: str | None = None

    def ready(self) -> bool:
        """Whether the request can be scheduled: its grammar compiled (or failed: see error)."""
        if self.matcher is not None or self.error is not None:
            return True
        if not self.future.done():
            return False
        import xgrammar as xgr

        try:
            compiled = self.future.result()
        except Exception as exc:  # noqa: BLE001 - the request fails, the engine goes on
            self.error = parser_message(exc)
            return True
        self.matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=self.stop_token_ids or None)
        return True

    def sync(self, output_token_ids: list[int]) -> bool:
        """Feed the matcher the output tokens it has not seen; True once the grammar terminated."""
        matcher = self.matcher
        while self.num_accepted < len(output_token_ids) and not self.terminated:
            token = output_token_ids[self.num_accepted]
            if not matcher.accept_token(token):
                # The mask allows only tokens the matcher accepts, so this is a bug, not input.
                raise RuntimeError(f"the grammar matcher rejected token {token}, which its mask allowed")
            self.num_accepted += 1
            self.terminated = matcher.is_terminated()
        return self.terminated


@dataclass(slots=True)
class StructuredOutputManager:
    vocab_size: int
    tokenizer_info: object | None = None
    compiler: object | None = None
    executor: ThreadPoolExecutor | None = None
    cache: OrderedDict = field(default_factory=OrderedDict)  # key -> Future[CompiledGrammar]
    batch_matcher: object | None = None

    def init(self, tokenizer_info_json: str) -> None:
        """Take the frontend's xgrammar TokenizerInfo (JSON); done once, before any grammar."""
        if self.compiler is not None:
            return
        import xgrammar as xgr

        self.tokenizer_info = xgr.TokenizerInfo.deserialize_json(tokenizer_info_json)
        self.compiler = xgr.GrammarCompiler(self.tokenizer_info, max_threads=8, cache_enabled=True)
        # One thread: compiles queue behind each other instead of taking the step loop's cores.
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagoda-grammar")
        self.batch_matcher = xgr.BatchGrammarMatcher()

    def request_grammar(self, params: StructuredOutputsParams, stop_token_ids: list[int]) -> RequestGrammar:
        if self.compiler is None:
            raise ValueError("structured outputs need the tokenizer's vocabulary, which the frontend "
                             "did not send to the engine")
        key = params.key()
        future = self.cache.get(key)
        if future is None or (future.done() and future.exception() is not None):
            future = self.executor.submit(compile_grammar, self.compiler, key)
            self.cache[key] = future
            while len(self.cache) > CACHE_ENTRIES:
                self.cache.popitem(last=False)
        else:
            self.cache.move_to_end(key)
        return RequestGrammar(key, future, stop_token_ids)

    def wait_for_compiles(self, grammars: list[RequestGrammar], timeout: float) -> None:
        """Sleep until one of these grammars compiled (or timeout): the step loop has nothing else."""
        pending = [g.future for g in grammars if not g.future.done()]
        if pending:
            wait_futures(pending, timeout=timeout, return_when="FIRST_COMPLETED")

    def fill_bitmask(self, grammars: list[RequestGrammar], bitmask) -> None:
        """Fill row i of the int32 CPU bitmask (len(grammars), ceil(vocab/32)) with what grammar i
        allows next; a large batch is filled by xgrammar's thread pool."""
        matchers = [g.matcher for g in grammars]
        if len(matchers) == 1:
            matchers[0].fill_next_token_bitmask(bitmask, 0)
        else:
            self.batch_matcher.batch_fill_next_token_bitmask(matchers, bitmask)

    def shutdown(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)
