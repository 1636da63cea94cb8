"""The paged KV cache's bookkeeping: a block pool with reference counts and a prefix cache."""

from pagoda.runtime.core.kv.block_hash import BlockHash, hash_block_tokens
from pagoda.runtime.core.kv.block_pool import BlockPool, KVBlock
from pagoda.runtime.core.kv.kv_cache_manager import KVCacheManager

__all__ = ["BlockHash", "BlockPool", "KVBlock", "KVCacheManager", "hash_block_tokens"]
