"""Which FP8 scheme a model runs with: from its config.json's quantization_config, or --quantization fp8.

Two checkpoint formats are read, as vLLM reads them:
- `quant_method: fp8` (AutoFP8, llm-compressor's older export, many Hub FP8 models): FP8 weights with a
  `weight_scale` per tensor (or per output channel), and `activation_scheme` static (a per-tensor
  `input_scale` in the checkpoint) or dynamic (per tensor, computed each forward);
- compressed-tensors `float-quantized` (llm-compressor's FP8_DYNAMIC and FP8 recipes): parsed with the
  compressed-tensors package, FP8 weights with per-tensor or per-channel scales and dynamic per-token,
  dynamic per-tensor or static per-tensor FP8 activations (or none: weight-only).
Anything else (block-wise FP8, int4/int8, 4-bit floats, several schemes in one model) is refused
here, at load, with the scheme's name and what is supported.

An image-text checkpoint served text only (models/text_only.py) names its modules with the
vision-language model's prefixes (`language_model.model.layers.0...`, `re:.*vision_tower.*`,
`language_model.lm_head`): the scheme matches each text module under every name the text_only
renames give it.

Whatever the checkpoint's granularity, a loaded weight keeps one float32 scale per output row
(a per-tensor scale repeated): fused q|k|v and gate|up shards with their own scales stay exact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from pagoda.runtime.models.text_only import TEXT_ONLY, checkpoint_aliases

ACTIVATIONS = ("dynamic-token", "dynamic-tensor", "static-tensor", "none")

SUPPORTED = ("quant_method fp8 (per-tensor or per-channel weight_scale; activation_scheme static or dynamic), "
             "compressed-tensors float-quantized (8-bit float weights by tensor or channel; activations "
             "8-bit float by token or tensor, dynamic or static, or none), and --quantization fp8 on a "
             "bf16/fp16/fp32 checkpoint")


@dataclass(frozen=True, slots=True)
class FP8Scheme:
    source: str  # "fp8" or "compressed-tensors" (the checkpoint's quantization_config), "online" (--quantization)
    serialized: bool  # the checkpoint's linear weights are FP8 already (with their scales)
    activations: str  # one of ACTIVATIONS: how a linear layer's input is quantized
    ignore: tuple[str, ...] = ()  # checkpoint module names (or "re:" patterns) left unquantized
    targets: tuple[str, ...] = ("Linear",)  # compressed-tensors' targets: "Linear" is every linear layer
    renames: tuple[tuple[str, str], ...] = ()  # an image-text checkpoint's prefix -> the text model's

    def quantizes(self, names: list[str]) -> bool:
        """Whether the layer that holds these checkpoint modules (q|k|v fused: three names) is FP8.
        The parts of one fused layer must agree, as in vLLM."""
        hits = [self._quantizes(n) for n in names]
        if any(hits) and not all(hits):
            raise UnsupportedQuantization(f"quantization_config quantizes only some of the fused layers {names}: "
                                          "the parts of one fused layer must be quantized alike")
        return bool(hits) and all(hits)

    def _quantizes(self, name: str) -> bool:
        names = checkpoint_aliases(self.renames, name)
        targeted = "Linear" in self.targets or any(_matches(n, t) for n in names for t in self.targets)
        return targeted and not any(_matches(n, pattern) for n in names for pattern in self.ignore)


def _matches(name: str, pattern: str) -> bool:
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    return name == pattern


class UnsupportedQuantization(ValueError):
    pass


def resolve_scheme(hf_config: dict, quantization: str | None) -> FP8Scheme | None:
    """The model's FP8 scheme, None for a plain model without --quantization; raises
    UnsupportedQuantization naming the scheme and what is supported."""
    qc = hf_config.get("quantization_config")
    if qc is None:
        if quantization is None:
            return None
        if quantization != "fp8":
            raise UnsupportedQuantization(f"--quantization {quantization} is not supported; supported: fp8")
        return FP8Scheme(source="online", serialized=False, activations="dynamic-token")
    method = str(qc.get("quant_method", "")).lower()
    if method == "fp8":
        scheme = _fp8_method(qc)
    elif method == "compressed-tensors":
        scheme = _compressed_tensors(qc)
    else:
        raise UnsupportedQuantization(f"checkpoint quantization {method or qc!r} is not supported; Pagoda reads "
                                      f"{SUPPORTED}")
    if quantization not in (None, "fp8"):
        raise UnsupportedQuantization(f"--quantization {quantization} does not match the checkpoint's {method}")
    text_only = TEXT_ONLY.get((hf_config.get("architectures") or [""])[0])
    return replace(scheme, renames=text_only.renames) if text_only else scheme


def _fp8_method(qc: dict) -> FP8Scheme:
    if qc.get("weight_block_size"):
        raise UnsupportedQuantization(
            f"block-wise FP8 (quant_method fp8 with weight_block_size {qc['weight_block_size']}) is not supported; "
            f"Pagoda reads {SUPPORTED}")
    act = str(qc.get("activation_scheme", "dynamic")).lower()
    if act not in ("static", "dynamic"):
        raise UnsupportedQuantization(f"quant_method fp8 with activation_scheme {act!r} is not supported; "
                                      "supported: static, dynamic")
    if qc.get("is_checkpoint_fp8_serialized") is False:
        raise UnsupportedQuantization("quant_method fp8 with is_checkpoint_fp8_serialized false: use a bf16 "
                                      "checkpoint with --quantization fp8 instead")
    ignore = qc.get("ignored_layers") or qc.get("modules_to_not_convert") or []
    # vLLM's dynamic fp8 scheme scales each activation tensor as a whole (per-tensor)
    return FP8Scheme(source="fp8", serialized=True, activations=f"{act}-tensor" if act == "static" else
                     "dynamic-tensor", ignore=tuple(ignore))


def _compressed_tensors(qc: dict) -> FP8Scheme:
    from compressed_tensors.quantization import QuantizationConfig

    try:
        config = QuantizationConfig.model_validate(qc)
    except Exception as exc:  # pydantic's ValidationError, or the package's own checks
        raise UnsupportedQuantization(f"compressed-tensors quantization_config does not parse: {exc}") from exc
    groups = list(config.config_groups.values())
    formats = {g.format or config.format for g in groups}
    if formats != {"float-quantized"}:
        raise UnsupportedQuantization(f"compressed-tensors format {', '.join(sorted(map(str, formats)))} is not "
                                      f"supported; Pagoda reads {SUPPORTED}")
    if len(groups) != 1:
        raise UnsupportedQuantization(f"compressed-tensors with {len(groups)} config groups is not supported "
                                      "(one FP8 scheme for every linear layer is)")
    (group,) = groups
    w, a = group.weights, group.input_activations
    if w is None or w.type != "float" or w.num_bits != 8 or not w.symmetric or w.strategy not in ("tensor", "channel"):
        described = "none" if w is None else f"{w.num_bits}-bit {w.type} by {w.strategy}"
        raise UnsupportedQuantization(f"compressed-tensors weights {described} are not supported; "
                                      f"Pagoda reads {SUPPORTED}")
    if a is None:
        activations = "none"
    elif a.type != "float" or a.num_bits != 8 or not a.symmetric:
        raise UnsupportedQuantization(f"compressed-tensors activations {a.num_bits}-bit {a.type} are not supported; "
                                      f"Pagoda reads {SUPPORTED}")
    elif a.strategy == "token" and a.dynamic:
        activations = "dynamic-token"
    elif a.strategy == "tensor":
        activations = "dynamic-tensor" if a.dynamic else "static-tensor"
    else:
        raise UnsupportedQuantization(f"compressed-tensors activations by {a.strategy} (dynamic={a.dynamic}) are "
                                      f"not supported; Pagoda reads {SUPPORTED}")
    if group.output_activations is not None:
        raise UnsupportedQuantization("compressed-tensors output_activations quantization is not supported")
    return FP8Scheme(source="compressed-tensors", serialized=True, activations=activations,
                     ignore=tuple(config.ignore or ()), targets=tuple(group.targets))


def is_fp8_checkpoint(hf_config: dict) -> bool:
    """config.json's own word, without torch or compressed-tensors (the memory plan reads it)."""
    qc = hf_config.get("quantization_config") or {}
    return str(qc.get("quant_method", "")).lower() in ("fp8", "compressed-tensors")
