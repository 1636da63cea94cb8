"""Model implementations and the registry that maps config.json's architecture to them."""

from pagoda.runtime.models.registry import SUPPORTED_ARCHITECTURES, get_model_class

__all__ = ["SUPPORTED_ARCHITECTURES", "get_model_class"]
