"""Test group 4: the block pool and prefix cache on their own: hash chain, LRU order, ref counts."""

from __future__ import annotations

import pytest

from pagoda.runtime.core.kv import BlockPool, KVCacheManager, hash_block_tokens
from pagoda.runtime.core.request import Request
from pagoda.runtime.sampling_params import SamplingParams

BS = 4


def make_request(rid: str, tokens: list[int], **kwargs) -> Request:
    return Request(
        rid, tokens, SamplingParams(max_tokens=8), eos_token_id=None, max_tokens=8, block_size=BS, **kwargs
    )


def test_hash_chain_names_the_whole_prefix():
    a = make_request("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    b = make_request("b", [1, 2, 3, 4, 5, 6, 7, 8, 0])
    c = make_request("c", [0, 2, 3, 4, 5, 6, 7, 8])
    assert len(a.block_hashes) == 2  # only full blocks are hashed
    assert a.block_hashes == b.block_hashes
    assert a.block_hashes[0] == hash_block_tokens(None, [1, 2, 3, 4])
    assert a.block_hashes[1] == hash_block_tokens(a.block_hashes[0], [5, 6, 7, 8])
    # Same tokens in block 1, different parent: a different hash.
    assert c.block_hashes[1] != a.block_hashes[1]
    assert (
        make_request("s", [1, 2, 3, 4], cache_salt=b"x").block_hashes
        != make_request("t", [1, 2, 3, 4]).block_hashes
    )
    # Generated tokens extend the chain as blocks fill.
    for t in (10, 11, 12):
        a.append_output_token(t)
    assert len(a.block_hashes) == 3
    assert a.block_hashes[2] == hash_block_tokens(a.block_hashes[1], [9, 10, 11, 12])


def test_lru_evicts_least_recently_freed_first():
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(3)
    for i, block in enumerate(blocks):
        pool.cache_full_block(block, hash_block_tokens(None, [i]))
    assert pool.num_free_blocks == 1
    pool.free_blocks([blocks[1]])
    pool.free_blocks([blocks[0]])
    pool.free_blocks([blocks[2]])
    # Free queue: the never-used block 3, then 1, 0, 2 in the order they were freed.
    assert [b.block_id for b in pool.get_new_blocks(1)] == [3]
    assert pool.get_cached_block(hash_block_tokens(None, [1])) is blocks[1]
    evicted = pool.get_new_blocks(1)[0]
    assert evicted is blocks[1] and evicted.block_hash is None
    assert pool.get_cached_block(hash_block_tokens(None, [1])) is None  # evicted from the cache
    assert pool.get_cached_block(hash_block_tokens(None, [0])) is blocks[0]  # still cached
    # Touching a cached free block takes it out of the free queue.
    pool.touch([blocks[0]])
    assert blocks[0].ref_cnt == 1 and pool.num_free_blocks == 1
    assert pool.get_new_blocks(1)[0] is blocks[2]
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)


def test_ref_counts_under_sharing():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    prompt = list(range(10, 20))  # 2 full blocks + 2 tokens
    a = make_request("a", prompt)
    assert kv.get_computed_blocks(a) == ([], 0)
    assert kv.allocate_slots(a, a.num_tokens) is not None
    a.num_computed_tokens = a.num_tokens
    assert len(kv.req_to_blocks["a"]) == 3

    b = make_request("b", prompt + [99, 98])
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 8 and hits == kv.req_to_blocks["a"][:2]
    kv.allocate_slots(b, b.num_tokens - num_hit, hits)
    assert [blk.ref_cnt for blk in kv.req_to_blocks["b"]] == [2, 2, 1]
    assert kv.prefix_cache_hits == 8 and kv.prefix_cache_queries == 10 + 12

    # A request whose prompt is exactly two cached blocks still computes its last token.
    c = make_request("c", prompt[:8])
    assert kv.get_computed_blocks(c)[1] == 4

    kv.free(a)
    assert [blk.ref_cnt for blk in kv.req_to_blocks["b"]] == [1, 1, 1]
    assert kv.block_pool.num_free_blocks == 8 - 3  # a's private third block is free again
    kv.free(b)
    assert kv.block_pool.num_free_blocks == 8
    # Freed but cached: a later request with the same prefix hits without recomputing.
    d = make_request("d", prompt)
    assert kv.get_computed_blocks(d)[1] == 8


def test_allocation_fails_cleanly_when_the_pool_is_short():
    kv = KVCacheManager(num_blocks=3, block_size=BS)
    a = make_request("a", list(range(12)))
    assert kv.allocate_slots(a, 12) is not None
    b = make_request("b", list(range(100, 105)))
    assert kv.allocate_slots(b, 5) is None
    assert "b" not in kv.req_to_blocks and kv.block_pool.num_free_blocks == 0


def test_free_order_evicts_a_sequence_tail_first():
    kv = KVCacheManager(num_blocks=3, block_size=BS)
    a = make_request("a", list(range(13)))  # 3 full blocks + 1 token -> only 3 blocks fit with 12
    a.prompt_token_ids = a.prompt_token_ids[:12]
    kv.allocate_slots(a, 12)
    blocks = list(kv.req_to_blocks["a"])
    kv.free(a)
    assert list(kv.block_pool.free_queue.values()) == blocks[::-1]


def test_prefix_caching_off_never_hits():
    kv = KVCacheManager(num_blocks=8, block_size=BS, enable_caching=False)
    a = make_request("a", list(range(9)))
    kv.allocate_slots(a, 9)
    kv.free(a)
    assert kv.get_computed_blocks(make_request("b", list(range(9)))) == ([], 0)
    assert not kv.block_pool.cached


def test_hashing_a_run_of_blocks_gives_the_block_by_block_digests():
    """Request hashes its new full blocks in one call (hash_full_blocks); the digests are
    hash_block_tokens', chained block by block, salted or not, from the root or a parent."""
    import random

    from pagoda.runtime.core.kv.block_hash import hash_full_blocks

    rng = random.Random(0)
    ids = [rng.randrange(0, 2**40) for _ in range(BS * 10)]
    for salt in (b"", b"tenant-a"):
        for parent in (None, hash_block_tokens(None, [9, 9, 9, 9, 9, 9, 9, 9])):
            want, h = [], parent
            for i in range(0, len(ids), BS):
                h = hash_block_tokens(h, ids[i : i + BS], salt)
                want.append(h)
            assert hash_full_blocks(parent, ids, BS, salt) == want
    r = make_request("r", ids[: 2 * BS + 1], cache_salt=b"s")  # 2 full blocks and a token
    for t in ids[2 * BS + 1 :]:
        r.append_output_token(t)
    assert r.block_hashes == hash_full_blocks(None, ids, BS, b"s")
