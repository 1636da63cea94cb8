"""Incremental detokenization and stop strings, per generated sequence (vLLM V1's semantics).

tokenizers' DecodeStream turns one token at a time into text and returns nothing while a UTF-8
character is still incomplete, so text never ends in half a character. Priming it with the end of
the prompt keeps tokenizers that strip a leading space (SentencePiece) from eating the first one.

Without stop strings nothing in the engine depends on the text, so the ids are only kept and the
text is produced when someone reads it (`get_text`, `flush`): a caller that wants only the final
text pays for decoding once, at the end, and a streaming one pays after the step's GPU work is
already launched. The tokens go through the stream in the same order either way, so the text is
the same. Given the completion's own token list (`token_ids`), the lazy detokenizer reads its ids
from there, and a running completion's update is then nothing at all (OutputProcessor skips it).
"""

from __future__ import annotations

from tokenizers.decoders import ByteLevel, DecodeStream

from pagoda.runtime.sampling_params import SamplingParams


def decodes_whole(tokenizer) -> bool:
    """Whether one decode of a whole output gives the stream's text (see the module's doc)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return (backend is not None and isinstance(backend.decoder, ByteLevel)
            and not getattr(tokenizer, "clean_up_tokenization_spaces", True))


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], params: SamplingParams,
                 token_ids: list[int] | None = None, whole: bool = False):
        self.tokenizer = tokenizer
        self.backend = tokenizer.backend_tokenizer
        self.skip_special_tokens = params.skip_special_tokens
        self.stream = DecodeStream(skip_special_tokens=self.skip_special_tokens)
        self.stop = params.stop
        self.min_tokens = params.min_tokens
        self.include_stop_str_in_output = params.include_stop_str_in_output
        # While streaming, hold back what could still turn out to be the start of a stop string.
        self.stop_buffer_length = (
            max(map(len, self.stop)) - 1 if self.stop and not self.include_stop_str_in_output else 0
        )
        self.output_text = ""
        self.num_tokens = 0
        self.flushed = False
        suffix = self._prompt_suffix(prompt_token_ids)
        for token_id in suffix:
            self._step(token_id)
        self.pending: list[int] = []  # output tokens whose bytes do not yet form whole characters
        # No stop strings (lazy): the output ids, of which the first `num_decoded` went through the
        # stream; `text_end` excludes a final EOS / stop token id that adds no text.
        self.lazy = not self.stop
        # The caller appends the ids to token_ids itself (stop strings decode in update instead).
        self.shared = self.lazy and token_ids is not None
        self.queued: list[int] = token_ids if self.shared else []
        self.num_decoded = 0
        self.text_end: int | None = None
        # A text never read before the end is decoded whole (whole: decodes_whole(tokenizer)).
        self.whole = whole and self.lazy and "\ufffd" not in self.backend.decode(
            suffix, skip_special_tokens=self.skip_special_tokens)

    def _prompt_suffix(self, prompt: list[int]) -> list[int]:
        # The shortest tail of 4+ tokens that decodes cleanly (as vLLM picks it).
        if len(prompt) <= 4:
            return prompt
        for i in range(4, min(len(prompt) + 1, 24)):
            suffix = prompt[-i:]
            if "\ufffd" not in self.backend.decode(suffix, skip_special_tokens=False):
                return suffix
        return prompt[-4:]

    def _step(self, token_id: int) -> str:
        try:
            piece = self.stream.step(self.backend, token_id)
        except Exception:
            # An id the tokenizer does not know (e.g. a padded vocab row): restart the stream.
            self.stream = DecodeStream(skip_special_tokens=self.skip_special_tokens)
            piece = None
        return piece or ""

    def _step_output(self, token_id: int) -> str:
        piece = self._step(token_id)
        if piece:
            self.pending.clear()
        else:
            self.pending.append(token_id)
        return piece

    def _decode_queued(self) -> None:
        end = len(self.queued) if self.text_end is None else self.text_end
        if self.num_decoded < end:
            ids, self.num_decoded = self.queued[self.num_decoded : end], end
            self.output_text += "".join(self._step_output(t) for t in ids)

    def decodes_whole_now(self) -> bool:
        """Whether flush() would decode the whole output in one call (nothing of it read yet)."""
        return self.whole and not self.num_decoded and not self.flushed

    def _whole_ids(self) -> list[int]:
        end = len(self.queued) if self.text_end is None else self.text_end
        self.num_decoded = end
        return self.queued[:end]

    def flush(self) -> None:
        """At the end, bytes that never completed a character appear as U+FFFD, as in a full
        decode, instead of vanishing."""
        if self.decodes_whole_now():
            self.output_text = self.backend.decode(self._whole_ids(), skip_special_tokens=self.skip_special_tokens)
            self.flushed = True
            return
        self._decode_queued()
        if self.pending and not self.flushed:
            self.output_text += self.tokenizer.decode(
                self.pending, skip_special_tokens=self.skip_special_tokens
            )
        self.pending.clear()
        self.flushed = True

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        """Add tokens' text; return the stop string that ended the sequence, if one did.

        A token that ended the sequence through EOS or stop_token_ids adds no text unless
        include_stop_str_in_output.
        """
        if self.lazy:
            if not self.shared:
                self.queued.extend(new_token_ids)
            if stop_terminated and not self.include_stop_str_in_output:
                self.text_end = len(self.queued) - 1
            self.num_tokens = len(self.queued)
            return None
        if stop_terminated and not self.include_stop_str_in_output:
            new_token_ids = new_token_ids[:-1]
            self.num_tokens += 1
        stop_check_offset = len(self.output_text)
        for token_id in new_token_ids:
            self.num_tokens += 1
            self.output_text += self._step_output(token_id)
            if self.min_tokens and self.num_tokens <= self.min_tokens:
                stop_check_offset = len(self.output_text)
        if stop_terminated or not self.stop or self.num_tokens <= self.min_tokens:
            return None
        hit = check_stop_strings(
            self.output_text,
            len(self.output_text) - stop_check_offset,
            self.stop,
            self.include_stop_str_in_output,
        )
        if hit is None:
            return None
        stop_str, truncate_to = hit
        if truncate_to != -1:
            self.output_text = self.output_text[:truncate_to]
        return stop_str

    def get_text(self, finished: bool) -> str:
        self._decode_queued()
        hold = 0 if finished else self.stop_buffer_length
        return self.output_text[:-hold] if hold else self.output_text


def check_stop_strings(
    output_text: str, new_char_count: int, stop: list[str], include_in_output: bool
) -> tuple[str, int] | None:
    """The first stop string in the newly added text (and the few characters before it that could
    start one), and where to cut the text: before it, or after it with include_in_output
    (-1 = no cut needed)."""
    if not new_char_count or not stop:
        return None
    for stop_str in stop:
        index = output_text.find(stop_str, 1 - new_char_count - len(stop_str))
        if index == -1:
            continue
        if include_in_output:
            index += len(stop_str)
            if index >= len(output_text):
                return stop_str, -1
        return stop_str, index
    return None


def flush_together(detokenizers: list[IncrementalDetokenizer]) -> None:
    """flush() for the completions that end in one step, with their whole decodes in one
    decode_batch call per skip_special_tokens setting: tokenizers spreads it over the cores (and
    lets go of the GIL), where a wave of final-only requests finishing together would otherwise
    decode one after another on the step thread. The texts are decode()'s."""
    groups: dict[bool, list[IncrementalDetokenizer]] = {}
    for d in detokenizers:
        if d.decodes_whole_now():
            groups.setdefault(d.skip_special_tokens, []).append(d)
    for skip, group in groups.items():
        if len(group) < 2:
            continue  # flush() decodes it alone
        texts = group[0].backend.decode_batch([d._whole_ids() for d in group], skip_special_tokens=skip)
        for d, text in zip(group, texts):
            d.output_text, d.flushed = text, True
