"""The paged KV cache's bookkeeping: a block pool with reference counts and a prefix cache."""

from pagoda.runtime.kv.block_hash import BlockHash, hash_block_tokens
from pagoda.runtime.kv.block_pool import BlockPool, KVBlock
from pagoda.runtime.kv.kv_cache_manager import KVCacheManager

__all__ = ["BlockHash", "BlockPool", "KVBlock", "KVCacheManager", "hash_block_tokens"]
