"""Chat templates and tokenization off the event loop, behind a character bound.

Tokenizing is the one part of a request's HTTP work that grows with the prompt: on the event loop a
10 MB prompt stalled every other request and /health for half a minute before its 400. So rendering
and tokenizing run on one worker thread, as vLLM's frontend does (one: a fast tokenizer is not
meant to be driven from several threads at once, and a small host has no core to spare for a
second), and the event loop only awaits them.

Before a text is tokenized, it is measured: no token spells more characters than the longest entry
of the vocabulary, so a text longer than max_model_len times that many characters cannot fit the
context, and is refused at once. A prompt over the context length is then refused in time
proportional to the limit, never to the prompt.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from pagoda.runtime.frontend.server.chat_template_request import ChatRender
from pagoda.runtime.frontend.server.errors import bad_request


def longest_token_chars(tokenizer) -> int:
    """The most characters one token can stand for. A vocabulary entry is at least as long as the
    text it decodes to: byte-level entries spell one character per byte, byte-fallback entries
    ("<0x0A>") are longer than their byte, and special tokens are matched as written."""
    return max((len(piece) for piece in tokenizer.get_vocab()), default=1) or 1


class PromptRenderer:
    def __init__(self, tokenizer, max_model_len: int, chat_template: str | None = None):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.chat_template = chat_template
        self.chars_per_token = longest_token_chars(tokenizer)
        self.max_chars = max_model_len * self.chars_per_token
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagoda-tokenizer")

    def check_chars(self, text: str, what: str = "prompt") -> None:
        if len(text) > self.max_chars:
            raise bad_request(
                f"This model's maximum context length is {self.max_model_len} tokens. However, the {what} "
                f"is {len(text)} characters long, more than {self.max_model_len} tokens can hold (a token "
                f"here spells at most {self.chars_per_token} characters). Please reduce the length of the "
                f"{what}.", param=what, code="context_length_exceeded")

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def encode(self, text: str, add_special_tokens: bool = True, what: str = "prompt") -> list[int]:
        self.check_chars(text, what)
        return await self._run(self._encode, text, add_special_tokens)

    async def encode_many(self, texts: list[str], add_special_tokens: bool = True,
                          what: str = "prompt") -> list[list[int]]:
        """A batch's prompts, every one measured before any is tokenized, in one job."""
        for text in texts:
            self.check_chars(text, what)
        return await self._run(lambda: [self._encode(t, add_special_tokens) for t in texts])

    async def render_chat(self, conversation: list[dict], render: ChatRender = ChatRender()) -> str:
        return await self._run(self._render, conversation, render)

    async def encode_chat(self, conversation: list[dict],
                          render: ChatRender = ChatRender()) -> tuple[str, list[int]]:
        """The rendered conversation and its ids. The template writes its own special tokens; the
        tokenizer adds its own on top only when asked (add_special_tokens)."""
        text = await self.render_chat(conversation, render)
        return text, await self.encode(text, add_special_tokens=render.add_special_tokens, what="messages")

    async def decode(self, token_ids: list[int]) -> str:
        return await self._run(self.tokenizer.decode, token_ids)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- on the worker thread ----

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=add_special_tokens).input_ids)

    def _render(self, conversation: list[dict], render: ChatRender) -> str:
        if render.continue_final_message and (render.add_generation_prompt
                                              or conversation[-1]["role"] != "assistant"):
            raise bad_request("continue_final_message needs a final assistant message and "
                              "add_generation_prompt false", param="continue_final_message")
        try:
            return self.tokenizer.apply_chat_template(
                conversation, tools=render.tools, documents=render.documents, tokenize=False,
                add_generation_prompt=render.add_generation_prompt,
                continue_final_message=render.continue_final_message,
                chat_template=render.template or self.chat_template, **render.variables)
        except Exception as exc:  # jinja errors, or a tokenizer without a template
            param = "chat_template" if render.template is not None else "messages"
            raise bad_request(f"could not apply the chat template: {exc}", param=param) from None
