"""Which runner a checkpoint gets (generate or pooling), and how a pooling runner pools: vLLM's rules.

`--runner auto` picks pooling for a checkpoint that carries a sentence-transformers Pooling module
(`modules.json`) or whose architecture is a bare `*Model` (LlamaModel, Qwen2Model: what AutoModel
saves), and generate otherwise. The pooling type and normalization come, in this order, from
`--pooler-config` (JSON), the sentence-transformers files (`1_Pooling/config.json`'s `pooling_mode`,
or the older `pooling_mode_*` flags; normalize only when a Normalize module is listed), and the
decoder default (LAST, normalized). Dense modules after the pooling are applied to the pooled
vector in order (worker/st_dense.py), as vLLM applies a checkpoint's projector. Standard library only: `pagoda plan` and the operator may import it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from pagoda.runtime.engine_args import RUNNERS

logger = logging.getLogger(__name__)

POOLING_TYPES = ("LAST", "MEAN", "CLS")
# Sentence-transformers modules by class name: `sentence_transformers.models.Pooling` (before 5.x) and
# `sentence_transformers.sentence_transformer.modules.pooling.Pooling` (6.x) are one module.
ST_AFTER_POOLING = ("Dense", "Normalize")  # applied: Dense projections in order, then L2 normalization
# Modules that change the embedding in ways Pagoda does not apply; ignoring them would give wrong
# vectors, so a checkpoint that lists one is refused.
ST_UNSUPPORTED = ("LayerNorm", "WeightedLayerPooling", "Dropout", "CNN", "LSTM", "Router")
ST_POOLING_NAMES = {"lasttoken": "LAST", "mean": "MEAN", "mean_tokens": "MEAN", "cls": "CLS", "cls_token": "CLS"}
# Architecture suffixes vLLM maps to a runner (its _SUFFIX_TO_DEFAULTS, the text-only part).
GENERATE_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "ChatModel", "LMHeadModel")
POOLING_SUFFIXES = ("ForTextEncoding", "EmbeddingModel", "Model")


@dataclass(slots=True, frozen=True)
class PoolerConfig:
    pooling_type: str = "LAST"  # LAST, MEAN or CLS, over the final norm's hidden states
    normalize: bool = True  # L2-normalize the pooled vector (a request may override)
    # The sentence-transformers Dense folders applied to the pooled vector, in order, and the
    # embedding's size after them (None: the hidden size).
    dense: tuple[str, ...] = ()
    dimension: int | None = None


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


def st_class(module: dict) -> str:
    """A modules.json entry's class name ('Dense'), whatever package path the release wrote."""
    kind = module.get("type", "")
    return kind.rsplit(".", 1)[-1] if kind.startswith("sentence_transformers") else kind


def sentence_transformers_pooling(path: Path) -> dict | None:
    """{"pooling_type", "normalize", "dense", "dimension"} from a sentence-transformers checkpoint,
    or None without one."""
    modules_file = Path(path) / "modules.json"
    if not modules_file.is_file():
        return None
    modules = json.loads(modules_file.read_text())
    classes = [st_class(m) for m in modules]
    for kind, module in zip(classes, modules):
        if kind in ST_UNSUPPORTED:
            raise ValueError(f"{modules_file} lists {module.get('type')}, which Pagoda's pooling runner does "
                             "not apply; its embeddings would be wrong")
    if "Pooling" not in classes:
        return None
    after = modules[classes.index("Pooling") + 1:]
    for module in after:
        if st_class(module) not in ST_AFTER_POOLING:
            raise ValueError(f"{modules_file} lists {module.get('type')} after Pooling; Pagoda applies only "
                             "Dense projections and a final Normalize there")
    after_classes = [st_class(m) for m in after]
    if "Normalize" in after_classes and "Dense" in after_classes[after_classes.index("Normalize"):]:
        raise ValueError(f"{modules_file} normalizes before a Dense projection; Pagoda normalizes last")
    pooling = modules[classes.index("Pooling")]
    dense = tuple(m["path"] for m in after if st_class(m) == "Dense")
    dimension = None
    if dense:
        dimension = int(json.loads((Path(path) / dense[-1] / "config.json").read_text())["out_features"])
    return {"pooling_type": _pooling_mode(Path(path) / pooling["path"] / "config.json"),
            # As vLLM reads it: normalized only when the module list has a Normalize step.
            "normalize": "Normalize" in after_classes, "dense": dense, "dimension": dimension}


def _pooling_mode(config_file: Path) -> str:
    """LAST, MEAN or CLS from a Pooling config: 6.x's `pooling_mode` or the older pooling_mode_* flags."""
    settings = json.loads(config_file.read_text())
    if "pooling_mode" in settings:
        mode = settings["pooling_mode"]
        modes = list(mode) if isinstance(mode, (list, tuple)) else [mode]
    else:
        modes = [k.removeprefix("pooling_mode_") for k, v in settings.items()
                 if k.startswith("pooling_mode_") and v is True]
    if len(modes) != 1 or modes[0] not in ST_POOLING_NAMES:
        raise ValueError(f"{config_file.parent.name}/config.json asks for pooling {modes or 'none'}; Pagoda "
                         "pools with exactly one of lasttoken, mean and cls")
    return ST_POOLING_NAMES[modes[0]]


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
