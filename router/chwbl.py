"""Consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam, 2016), as KubeAI's
PrefixHash uses it.

Each endpoint sits at `replication` points of a 64-bit hash ring. A key goes to the first endpoint
clockwise from its hash whose load is under the bound `ceil(load_factor * (total + 1) / n)`; the
+1 counts the request being placed. The same key keeps landing on the same endpoint (where its
prefix is cached) until that endpoint carries more than `load_factor` times the mean, and then
spills to the next endpoint on the ring, the same one every time. Adding or removing an endpoint
moves only the keys next to its points.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Callable, Sequence

DEFAULT_REPLICATION = 256  # KubeAI's default
DEFAULT_LOAD_FACTOR = 1.25  # KubeAI's meanLoadPercentage of 125


def hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class HashRing:
    def __init__(self, members: Sequence[str], replication: int = DEFAULT_REPLICATION):
        if not members:
            raise ValueError("a hash ring needs at least one member")
        points = sorted((hash64(f"{member}#{i}"), member) for member in set(members) for i in range(replication))
        self.members = tuple(sorted(set(members)))
        self._hashes = [h for h, _ in points]
        self._owners = [m for _, m in points]

    def pick(self, key: str, load: Callable[[str], int], load_factor: float = DEFAULT_LOAD_FACTOR) -> str:
        """The first member clockwise from the key whose load stays within the bound."""
        total = sum(load(m) for m in self.members)
        bound = math.ceil(load_factor * (total + 1) / len(self.members))
        start = bisect.bisect(self._hashes, hash64(key))
        seen: set[str] = set()
        for i in range(len(self._owners)):
            member = self._owners[(start + i) % len(self._owners)]
            if member in seen:
                continue
            if load(member) + 1 <= bound:
                return member
            seen.add(member)
            if len(seen) == len(self.members):
                break
        # Unreachable with load_factor >= 1 (some member is at or below the mean); kept total anyway.
        return min(self.members, key=load)
