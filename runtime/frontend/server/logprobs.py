"""Logprobs in OpenAI's shapes: /v1/completions' parallel lists and /v1/chat/completions' content.

The OutputProcessor already gives each logprob its token's text (Logprob.decoded_token); a token
without one is decoded here.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagoda.runtime.frontend.server.protocol import CompletionLogprobs, TokenLogprob, TopLogprob


@dataclass(slots=True)
class ChoiceState:
    """What one choice of a stream has already sent."""

    num_tokens: int = 0  # completion tokens streamed so far (for usage)
    text_offset: int = 0  # completions logprobs: characters of the token strings sent so far
    started: bool = False
    done: bool = False


def token_text(tokenizer, token_id: int, logprob, as_token_id: bool = False) -> str:
    if as_token_id:  # vLLM's return_tokens_as_token_ids: tokens that are not valid UTF-8 stay tellable apart
        return f"token_id:{token_id}"
    decoded = getattr(logprob, "decoded_token", None) if logprob is not None else None
    return decoded if decoded is not None else tokenizer.decode([token_id])


def completion_logprobs(tokenizer, token_ids, logprobs, num_top: int, text_offset: int = 0,
                        as_token_ids: bool = False) -> CompletionLogprobs:
    """/v1/completions logprobs: parallel lists of tokens, their logprobs, top alternatives and
    character offsets. A None entry (the first prompt token under echo) has no logprob."""
    out = CompletionLogprobs()
    for tid, entry in zip(token_ids, logprobs):
        chosen = entry.get(tid) if entry else None
        tok = token_text(tokenizer, tid, chosen, as_token_ids)
        out.tokens.append(tok)
        out.text_offset.append(text_offset)
        text_offset += len(tok)
        if entry is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            continue
        out.token_logprobs.append(_finite(chosen.logprob) if chosen is not None else None)
        top = sorted(entry.items(), key=lambda kv: _rank(kv[1]))
        if num_top is not None:
            top = [kv for kv in top if _rank(kv[1]) <= num_top or kv[0] == tid]
        # Keyed by text, as OpenAI's format is: tokens that print alike (U+FFFD for partial bytes)
        # share a key, and the more likely one keeps it.
        alternatives: dict[str, float] = {}
        for t, lp in top:
            alternatives.setdefault(token_text(tokenizer, t, lp, as_token_ids), _finite(lp.logprob))
        out.top_logprobs.append(alternatives)
    return out


def chat_logprobs(tokenizer, token_ids, logprobs, num_top: int, as_token_ids: bool = False) -> list[TokenLogprob]:
    """/v1/chat/completions logprobs.content: one entry per token with its top alternatives."""
    content = []
    for tid, entry in zip(token_ids, logprobs):
        entry = entry or {}
        chosen = entry.get(tid)
        tok = token_text(tokenizer, tid, chosen, as_token_ids)
        top = sorted(entry.items(), key=lambda kv: _rank(kv[1]))[:num_top] if num_top else []
        content.append(TokenLogprob(
            token=tok,
            logprob=_finite(chosen.logprob) if chosen is not None else -9999.0,
            bytes=list(tok.encode("utf-8")),
            top_logprobs=[_top(tokenizer, t, lp, as_token_ids) for t, lp in top],
        ))
    return content


def _top(tokenizer, token_id: int, lp, as_token_id: bool) -> TopLogprob:
    tok = token_text(tokenizer, token_id, lp, as_token_id)
    return TopLogprob(token=tok, logprob=_finite(lp.logprob), bytes=list(tok.encode("utf-8")))


def _rank(lp) -> int:
    return lp.rank if lp.rank is not None else 1 << 30


def _finite(x: float) -> float:
    # -inf is not JSON; OpenAI uses -9999.0 for "impossible".
    return max(float(x), -9999.0)
