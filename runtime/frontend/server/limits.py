"""Caps on what one request may ask for, each refused with a 400 that names its field.

Pydantic has already checked types; these bound the work a single request can put on everyone
else: every stop string is searched for in every detokenized delta of the request, and every prompt
of a batch is its own engine request. The caps are per server (`pagoda serve --max-stop-strings`
...), so they live here and not in the static request models.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from pagoda.runtime.frontend.server.errors import bad_request


@dataclass(frozen=True, slots=True)
class RequestLimits:
    # 32 MiB holds a prompt far beyond any context length; the body limit counts the bytes as they
    # arrive, so a chunked body cannot slip past it (server/app.py).
    max_body_bytes: int = 32 << 20
    # OpenAI takes 4 stop strings; vLLM takes any number. 64 is far past real use.
    max_stop_strings: int = 64
    max_stop_string_chars: int = 1024
    max_logit_bias: int = 1024
    max_prompts: int = 1024  # prompts in one /v1/completions batch

    def check_stop(self, stop: str | list[str] | None, param: str = "stop") -> None:
        """Stop strings, and bad_words under the same caps (each is tokenized and matched per step)."""
        stops = [stop] if isinstance(stop, str) else (stop or [])
        if len(stops) > self.max_stop_strings:
            raise bad_request(f"{param} holds {len(stops)} strings; this server takes at most "
                              f"{self.max_stop_strings}", param=param, code="too_many_stop_strings")
        for s in stops:
            if len(s) > self.max_stop_string_chars:
                raise bad_request(f"a {param} string is {len(s)} characters long; this server takes at most "
                                  f"{self.max_stop_string_chars}", param=param, code="stop_string_too_long")

    def check_logit_bias(self, logit_bias: dict | None) -> None:
        if logit_bias and len(logit_bias) > self.max_logit_bias:
            raise bad_request(f"logit_bias holds {len(logit_bias)} entries; this server takes at most "
                              f"{self.max_logit_bias}", param="logit_bias", code="logit_bias_too_large")

    def check_prompts(self, prompt) -> None:
        """A batch is a list of strings or of token-id lists; a flat list of ids is one prompt."""
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) and len(prompt) > self.max_prompts:
            raise bad_request(f"prompt holds {len(prompt)} prompts; this server takes at most "
                              f"{self.max_prompts} in one request", param="prompt", code="too_many_prompts")

    def check(self, req) -> None:
        """Every cap that applies to a completion or chat request."""
        self.check_stop(req.stop)
        self.check_stop(req.bad_words, param="bad_words")
        self.check_logit_bias(req.logit_bias)
        if hasattr(req, "prompt"):
            self.check_prompts(req.prompt)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = RequestLimits()
    p.add_argument("--max-request-body-bytes", type=_positive, default=d.max_body_bytes, metavar="BYTES",
                   help="answer 413 to a request body over this size, chunked or not (default: %(default)s)")
    p.add_argument("--max-stop-strings", type=_positive, default=d.max_stop_strings, metavar="N",
                   help="most stop strings in one request (default: %(default)s)")
    p.add_argument("--max-stop-string-chars", type=_positive, default=d.max_stop_string_chars, metavar="N",
                   help="longest stop string, in characters (default: %(default)s)")
    p.add_argument("--max-logit-bias", type=_positive, default=d.max_logit_bias, metavar="N",
                   help="most logit_bias entries in one request (default: %(default)s)")
    p.add_argument("--max-prompts", type=_positive, default=d.max_prompts, metavar="N",
                   help="most prompts in one /v1/completions batch (default: %(default)s)")


def from_args(args) -> RequestLimits:
    d = RequestLimits()
    return RequestLimits(
        max_body_bytes=getattr(args, "max_request_body_bytes", d.max_body_bytes),
        max_stop_strings=getattr(args, "max_stop_strings", d.max_stop_strings),
        max_stop_string_chars=getattr(args, "max_stop_string_chars", d.max_stop_string_chars),
        max_logit_bias=getattr(args, "max_logit_bias", d.max_logit_bias),
        max_prompts=getattr(args, "max_prompts", d.max_prompts),
    )
