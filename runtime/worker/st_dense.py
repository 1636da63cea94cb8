"""A sentence-transformers checkpoint's Dense modules, applied to the pooled vectors on the device.

Embedding checkpoints such as EmbeddingGemma project the pooled hidden state through one or more
`Dense` modules (a linear layer, an activation, optionally a residual) before normalizing; their
folders (`2_Dense/` ...) hold a config.json and the weights as `linear.weight` / `linear.bias`
(`residual.weight` with use_residual). The projection runs in float32, as the pooled sums do, and
only on the prompts a step completes. Which folders apply, and in what order, comes from
modules.json (pooling_config.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

# The activations sentence-transformers saves by class path; only torch.nn classes load without
# trust_remote_code there, and these are the ones used in practice.
ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": lambda x: x,
    "torch.nn.modules.activation.Tanh": torch.tanh,
    "torch.nn.modules.activation.ReLU": F.relu,
    "torch.nn.modules.activation.GELU": F.gelu,
    "torch.nn.modules.activation.Sigmoid": torch.sigmoid,
    "torch.nn.modules.activation.SiLU": F.silu,
}
DEFAULT_ACTIVATION = "torch.nn.modules.activation.Tanh"  # Dense's own default when the config names none


class DenseLayer:
    def __init__(self, folder: Path, device: torch.device):
        config = json.loads((folder / "config.json").read_text())
        name = config.get("activation_function") or DEFAULT_ACTIVATION
        if name not in ACTIVATIONS:
            raise ValueError(f"{folder.name}/config.json: activation {name} is not supported "
                             f"({', '.join(sorted(ACTIVATIONS))})")
        self.activation = ACTIVATIONS[name]
        weights = _load_weights(folder)
        self.weight = weights["linear.weight"].to(device, torch.float32)
        expected = (int(config["out_features"]), int(config["in_features"]))
        if tuple(self.weight.shape) != expected:
            raise ValueError(f"{folder.name}: linear.weight is {tuple(self.weight.shape)}, config says {expected}")
        bias = weights.get("linear.bias") if config.get("bias", True) else None
        self.bias = None if bias is None else bias.to(device, torch.float32)
        self.residual = None
        if config.get("use_residual", False):
            # an identity skip when the sizes agree, else the saved projection
            residual = weights.get("residual.weight")
            self.residual = None if residual is None else residual.to(device, torch.float32)
            self.skip = True
        else:
            self.skip = False

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.activation(F.linear(x, self.weight, self.bias))
        if self.skip:
            out = out + (x if self.residual is None else F.linear(x, self.residual))
        return out


class DenseStack:
    def __init__(self, model_path: Path, folders: tuple[str, ...], device: torch.device):
        self.layers = [DenseLayer(Path(model_path) / folder, device) for folder in folders]

    def __call__(self, pooled: torch.Tensor) -> torch.Tensor:
        x = pooled.float()
        for layer in self.layers:
            x = layer(x)
        return x


def _load_weights(folder: Path) -> dict[str, torch.Tensor]:
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(str(folder / "model.safetensors"))
    if (folder / "pytorch_model.bin").is_file():
        return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{folder}: no model.safetensors or pytorch_model.bin for the Dense module")


def dense_projection(model_path: Path, device: torch.device) -> DenseStack | None:
    """The checkpoint's Dense modules after its Pooling (modules.json), or None when it has none."""
    from pagoda.runtime.pooling_config import sentence_transformers_pooling

    st = sentence_transformers_pooling(Path(model_path))
    return DenseStack(model_path, st["dense"], device) if st and st["dense"] else None
