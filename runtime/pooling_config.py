"""Which runner a checkpoint gets (generate or pooling), and how a pooling runner pools: vLLM's rules.

`--runner auto` picks pooling for a checkpoint that carries a sentence-transformers Pooling module
(`modules.json`) or whose architecture is a bare `*Model` (LlamaModel, Qwen2Model: what AutoModel
saves), and generate otherwise. The pooling type and normalization come, in this order, from
`--pooler-config` (JSON), the sentence-transformers files (`1_Pooling/config.json`'s
`pooling_mode_*` flag; normalize only when a Normalize module is listed), and the decoder default
(LAST, normalized). Standard library only: `pagoda plan` and the operator may import it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from pagoda.runtime.engine_args import RUNNERS

logger = logging.getLogger(__name__)

POOLING_TYPES = ("LAST", "MEAN", "CLS")
ST_POOLING = "sentence_transformers.models.Pooling"
ST_NORMALIZE = "sentence_transformers.models.Normalize"
# Sentence-transformers modules that change the embedding after pooling; ignoring them would give
# wrong vectors, so a checkpoint that lists one is refused.
ST_UNSUPPORTED = ("sentence_transformers.models.Dense", "sentence_transformers.models.LayerNorm",
                  "sentence_transformers.models.WeightedLayerPooling")
# Architecture suffixes vLLM maps to a runner (its _SUFFIX_TO_DEFAULTS, the text-only part).
GENERATE_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "ChatModel", "LMHeadModel")
POOLING_SUFFIXES = ("ForTextEncoding", "EmbeddingModel", "Model")


@dataclass(slots=True, frozen=True)
class PoolerConfig:
    pooling_type: str = "LAST"  # LAST, MEAN or CLS, over the final norm's hidden states
    normalize: bool = True  # L2-normalize the pooled vector (a request may override)


def parse_pooler_override(text: str | None) -> dict:
    """--pooler-config's JSON: {"pooling_type": "MEAN", "normalize": false}; other keys are refused."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"--pooler-config must be a JSON object: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError("--pooler-config must be a JSON object, like {\"pooling_type\": \"MEAN\"}")
    unknown = set(value) - {"pooling_type", "normalize"}
    if unknown:
        raise ValueError(f"--pooler-config: {', '.join(sorted(unknown))} not supported (pooling_type, normalize)")
    out = {}
    if value.get("pooling_type") is not None:
        kind = str(value["pooling_type"]).upper()
        if kind not in POOLING_TYPES:
            raise ValueError(f"--pooler-config: pooling_type must be one of {', '.join(POOLING_TYPES)}; got {kind!r}")
        out["pooling_type"] = kind
    if value.get("normalize") is not None:
        if not isinstance(value["normalize"], bool):
            raise ValueError("--pooler-config: normalize must be true or false")
        out["normalize"] = value["normalize"]
    return out


def sentence_transformers_pooling(path: Path) -> dict | None:
    """{"pooling_type", "normalize"} from a sentence-transformers checkpoint, or None without one."""
    modules_file = Path(path) / "modules.json"
    if not modules_file.is_file():
        return None
    modules = json.loads(modules_file.read_text())
    types = [m.get("type", "") for m in modules]
    for kind in types:
        if kind in ST_UNSUPPORTED:
            raise ValueError(f"{modules_file} lists {kind}, which Pagoda's pooling runner does not apply; "
                             "its embeddings would be wrong")
    pooling = next((m for m in modules if m.get("type") == ST_POOLING), None)
    if pooling is None:
        return None
    settings = json.loads((Path(path) / pooling["path"] / "config.json").read_text())
    modes = [k.removeprefix("pooling_mode_") for k, v in settings.items() if k.startswith("pooling_mode_") and v is True]
    names = {"lasttoken": "LAST", "mean_tokens": "MEAN", "cls_token": "CLS"}
    if len(modes) != 1 or modes[0] not in names:
        raise ValueError(f"{pooling['path']}/config.json asks for pooling {modes or 'none'}; Pagoda pools with "
                         "exactly one of pooling_mode_lasttoken, pooling_mode_mean_tokens, pooling_mode_cls_token")
    # As vLLM reads it: normalized only when the module list has a Normalize step.
    return {"pooling_type": names[modes[0]], "normalize": ST_NORMALIZE in types}


def resolve_runner(runner: str, path: Path, architecture: str) -> str:
    """generate or pooling, as vLLM's --runner auto decides."""
    if runner not in RUNNERS:
        raise ValueError(f"runner must be one of {', '.join(RUNNERS)}; got {runner!r}")
    bare = not architecture.endswith(GENERATE_SUFFIXES) and architecture.endswith(POOLING_SUFFIXES)
    if runner == "generate" and bare:
        raise ValueError(f"{architecture} is a checkpoint without an LM head: it makes embeddings only "
                         "(--runner pooling), not text")
    if runner != "auto":
        return runner
    if sentence_transformers_pooling(path) is not None:
        return "pooling"
    return "pooling" if bare else "generate"


def pooler_config_for(runner: str, path: Path, architecture: str, override: str | None = None
                      ) -> PoolerConfig | None:
    """The pooler a pooling runner uses for this checkpoint, or None for a generate runner."""
    if resolve_runner(runner, path, architecture) != "pooling":
        return None
    values = {**(sentence_transformers_pooling(path) or {}), **parse_pooler_override(override)}
    return PoolerConfig(**values)


def prefix_caching_for(enabled: bool, pooling_type: str | None) -> bool:
    """MEAN and CLS pooling read every prompt row's hidden state, which a cached prefix never
    computes: the pooling runner caches prefixes for LAST pooling only (as vLLM does)."""
    return enabled and pooling_type not in ("MEAN", "CLS")


def matryoshka_dimensions(hf_config: dict) -> list[int] | bool:
    """What `dimensions` a request may ask for, as vLLM reads config.json: the listed sizes, True
    for any size (is_matryoshka without a list), or False for a model without matryoshka training."""
    listed = hf_config.get("matryoshka_dimensions")
    if listed:
        return list(listed)
    return bool(hf_config.get("is_matryoshka", False))
