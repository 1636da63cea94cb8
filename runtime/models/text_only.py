"""Image-text checkpoints, served text only (as vLLM serves a text request to them).

Gemma 3 from 4B up ships as Gemma3ForConditionalGeneration: config.json nests the language model
under `text_config`, beside a `vision_config`, and its tensors carry the language model under a
prefix, next to a vision tower and a projector. Pagoda runs the language model with the text
family's class, reads its fields from `text_config`, renames its tensors, and skips the vision
ones without reading their bytes. Each architecture is one row of TEXT_ONLY: Gemma 3, Mistral 3
(Mistral Small 3.1 and 3.2, a Mistral language model beside a Pixtral tower), Qwen2-VL and
Qwen2.5-VL (a Qwen2 language model with multimodal RoPE, which on text alone is 1-D RoPE: its three
position components are then equal, so each frequency section turns by the same position).

Pure Python at import (no torch), like hf_fields: `pagoda plan` reads the config through it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TextOnly:
    text_architecture: str  # the registry's class for the language model
    renames: tuple[tuple[str, str], ...]  # checkpoint prefix -> the text model's; the first match wins
    skipped: tuple[str, ...]  # prefixes of the tensors a text request never reads


# The LLaVA-style layout: transformers 5's in-memory names, and the published checkpoints' (4.5x, and
# what transformers 5.2x writes back).
_LLAVA_RENAMES = (
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
)
_LLAVA_SKIPPED = ("model.vision_tower.", "model.multi_modal_projector.", "vision_tower.", "multi_modal_projector.")
# Qwen2-VL's: transformers 5's in-memory names, or the published ones, whose text layers are already
# the text model's (model.layers.*) beside a top-level visual.* tower.
_QWEN_VL_RENAMES = (("model.language_model.", "model."),)
_QWEN_VL_SKIPPED = ("model.visual.", "visual.")

TEXT_ONLY = {
    "Gemma3ForConditionalGeneration": TextOnly("Gemma3ForCausalLM", _LLAVA_RENAMES, _LLAVA_SKIPPED),
    "Mistral3ForConditionalGeneration": TextOnly("MistralForCausalLM", _LLAVA_RENAMES, _LLAVA_SKIPPED),
    "Qwen2VLForConditionalGeneration": TextOnly("Qwen2ForCausalLM", _QWEN_VL_RENAMES, _QWEN_VL_SKIPPED),
    "Qwen2_5_VLForConditionalGeneration": TextOnly("Qwen2ForCausalLM", _QWEN_VL_RENAMES, _QWEN_VL_SKIPPED),
}

# Top-level fields that describe the checkpoint as a whole, not the vision or the text half; the
# text config's own values (transformers' class defaults) give way to them.
_CHECKPOINT_FIELDS = ("architectures", "dtype", "torch_dtype", "quantization_config", "eos_token_id",
                      "tie_word_embeddings")


def is_text_only(architecture: str) -> bool:
    return architecture in TEXT_ONLY


def text_architecture(architecture: str) -> str:
    """The class that runs this architecture's language model (itself, for a text model)."""
    entry = TEXT_ONLY.get(architecture)
    return entry.text_architecture if entry else architecture


def text_config(path: Path, cfg: dict) -> dict:
    """The language model's fields of an image-text checkpoint; any other config.json unchanged.
    Read through transformers (get_text_config): Google's config.json files give only the fields
    that differ from Gemma3TextConfig's defaults (gemma-3-4b-it's names no head count)."""
    architecture = (cfg.get("architectures") or [""])[0]
    if not is_text_only(architecture):
        return cfg
    from transformers import AutoConfig

    text = AutoConfig.from_pretrained(path).get_text_config().to_dict()
    if cfg.get("dtype") or cfg.get("torch_dtype"):  # the checkpoint's dtype, not the text class's default
        for key in ("dtype", "torch_dtype"):
            text.pop(key, None)
    text |= {key: cfg[key] for key in _CHECKPOINT_FIELDS if key in cfg}
    if text.get("tie_word_embeddings") and _stores_lm_head(path, TEXT_ONLY[architecture]):
        # transformers 5 writes Mistral3Config's default (tied) at the top level, and then does not
        # tie an LM head the checkpoint stores with values of its own: neither do we.
        text["tie_word_embeddings"] = False
    return text


def _stores_lm_head(path: Path, entry: TextOnly) -> bool:
    """Whether the checkpoint's tensors include the language model's LM head (read from the index or
    the safetensors headers, no tensor bytes); False where no weights are at hand (`pagoda plan` on
    a config.json alone)."""
    heads = ["lm_head.weight"] + [old + "weight" for old, new in entry.renames if new == "lm_head."]
    return any(name in heads for name in _tensor_names(path))


def _tensor_names(path: Path) -> list[str]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        return list(json.loads(index.read_text())["weight_map"])
    names = []
    for file in sorted(path.glob("*.safetensors")):
        with open(file, "rb") as f:  # the safetensors header: its length (8 bytes, little-endian), then JSON
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        names += [name for name in header if name != "__metadata__"]
    return names


def checkpoint_aliases(renames: tuple[tuple[str, str], ...], name: str) -> list[str]:
    """A text model's module name and what an image-text checkpoint may call it: its renames run
    backwards (model.layers.0.mlp.down_proj -> model.language_model.layers.0.mlp.down_proj and
    language_model.model.layers.0.mlp.down_proj; lm_head -> language_model.lm_head). Every layout's,
    not only the tensors': a quantization_config's module names come from the exporting tool's
    in-memory model, and transformers 5 saves the tensors under the older names."""
    dotted = name + "."
    aliases = [name] + [(old + dotted[len(new):])[:-1] for old, new in renames if dotted.startswith(new)]
    return list(dict.fromkeys(aliases))


class TextWeights:
    """Checkpoint tensor name -> the text model's, or None for one it never reads (the loader then
    opens no byte of it); counts the skipped ones for the load's one log line."""

    def __init__(self, architecture: str):
        self.architecture, self.entry, self.skipped = architecture, TEXT_ONLY[architecture], 0

    def __call__(self, name: str) -> str | None:
        if name.startswith(self.entry.skipped):
            self.skipped += 1
            return None
        for old, new in self.entry.renames:
            if name.startswith(old):
                return new + name[len(old):]
        return name  # already the text model's (lm_head., or a checkpoint saved text only)

    def log(self) -> None:
        logger.warning("%s: serving text only; images are not supported, and the vision tower and projector "
                       "(%d tensors) are skipped unread", self.architecture, self.skipped)
