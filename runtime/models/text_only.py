"""Image-text checkpoints, served text only (as vLLM serves a text request to them).

Gemma 3 from 4B up ships as Gemma3ForConditionalGeneration: config.json nests the language model
under `text_config`, beside a `vision_config`, and its tensors carry the language model under a
prefix, next to a vision tower and a projector. Pagoda runs the language model with the text
family's class, reads its fields from `text_config`, renames its tensors, and skips the vision
ones without reading their bytes. Each architecture is one row of TEXT_ONLY; Mistral 3 or the
Llama-family VLMs would be rows of their own.

Pure Python at import (no torch), like hf_fields: `pagoda plan` reads the config through it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TextOnly:
    text_architecture: str  # the registry's class for the language model
    renames: tuple[tuple[str, str], ...]  # checkpoint prefix -> the text model's; the first match wins
    skipped: tuple[str, ...]  # prefixes of the tensors a text request never reads


TEXT_ONLY = {
    "Gemma3ForConditionalGeneration": TextOnly(
        "Gemma3ForCausalLM",
        renames=(
            ("model.language_model.", "model."),  # transformers 5's in-memory names
            ("language_model.model.", "model."),  # the checkpoints Google published (transformers 4.5x)
            ("language_model.lm_head.", "lm_head."),
        ),
        skipped=("model.vision_tower.", "model.multi_modal_projector.", "vision_tower.", "multi_modal_projector."),
    ),
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
    return text


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
