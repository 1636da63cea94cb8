"""Request fields Pagoda does not implement: a 400 that names the field, never a silent 200.

vLLM's request models take unknown fields and only log a warning; OpenAI refuses them. Pagoda
refuses them too, so that a client never gets unconstrained or unscored output while believing it
asked for more. The fields below are known (vLLM's or OpenAI's) but not implemented: each gets a
400 that says so, except when its value asks for nothing (null, or the value that means "off"),
which is what clients that send every default do. Any other field is unknown and a 400 as well.
Fields that a model declares (they are implemented) never reach this list.
"""

from __future__ import annotations

from pydantic_core import PydanticCustomError

ANY = ()  # no value is harmless

# field -> the values that ask for nothing (accepted and dropped); null is always accepted.
NOT_IMPLEMENTED: dict[str, tuple] = {
    # vLLM's
    "use_beam_search": (False,),
    "length_penalty": (1.0,),
    "watermarking": (False,),
    "spaces_between_special_tokens": (True,),
    "logprob_token_ids": ANY,
    "prompt_embeds": ANY,
    "priority": (0,),
    "request_id": ANY,
    "session_id": ANY,
    "return_token_ids": (False,),
    "return_token_offsets": (False,),
    "return_mm_kwargs": (True,),
    "cache_salt": ANY,
    "kv_transfer_params": ANY,
    "ec_transfer_params": ANY,
    "vllm_xargs": ANY,
    "repetition_detection": ANY,
    "thinking_token_budget": (-1,),
    "stream_interval": (1,),
    "routed_experts_prompt_start": (0,),
    "logits_processors": ANY,
    "mm_processor_kwargs": ANY,
    "media_io_kwargs": ANY,
    "include_reasoning": (True,),
    "echo": (False,),  # chat's (prepend the last message); completions implement theirs
    # OpenAI's
    "reasoning_effort": ANY,
    "store": (False,),
    "metadata": ANY,
    "service_tier": ("auto", "default"),
    "modalities": (["text"],),
    "audio": ANY,
    "prediction": ANY,
    "web_search_options": ANY,
    "functions": ANY,
    "function_call": ANY,
    "verbosity": ANY,
    "prompt_cache_key": ANY,
    "safety_identifier": ANY,
}


def refuse_unimplemented(model, data, known: dict[str, tuple] = NOT_IMPLEMENTED):
    """A mode="before" validator's body: drop the no-op values of known fields, refuse the rest.
    `known` is the table of fields that are known but not implemented ({}: every undeclared field is unknown)."""
    if not isinstance(data, dict):
        return data
    fields = model.model_fields
    declared = set(fields) | {f.alias for f in fields.values() if f.alias}
    extra = [key for key in data if key not in declared]
    if not extra:
        return data
    data = dict(data)
    for key in extra:
        harmless = known.get(key)
        if harmless is None:
            # The name may itself be invalid Unicode (lone surrogates): escape it, or the 400 cannot be encoded.
            name = str(key).encode("utf-8", "backslashreplace").decode()
            raise PydanticCustomError("unknown_field", "{param} is not a field of this request", {"param": name})
        if data[key] is None or any(_same(data[key], v) for v in harmless):
            del data[key]
            continue
        raise PydanticCustomError("unsupported_field", "{param} is not supported by Pagoda",
                                  {"param": str(key)})
    return data


def _same(value, off) -> bool:
    # JSON's 1 and 1.0 are one number, but true is not 1.
    return value == off and isinstance(value, bool) == isinstance(off, bool)
