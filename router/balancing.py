"""Which ready endpoint of a group takes a request: the group's strategy decides.

- LeastLoad: the endpoint with the least load (load.py), ties broken in turn.
- PrefixHash: consistent hashing with bounded loads over the prompt's first characters
  (chwbl.py, prefix.py), with the router's in-flight counts as the loads.
- RoundRobin: in turn; the baseline the prefix-routing benchmark compares against.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection

from pagoda.router.chwbl import DEFAULT_LOAD_FACTOR, DEFAULT_REPLICATION, HashRing
from pagoda.router.fleet import Endpoint, Group
from pagoda.router.load import Loads


class Balancer:
    def __init__(self, loads: Loads, load_factor: float = DEFAULT_LOAD_FACTOR,
                 replication: int = DEFAULT_REPLICATION):
        if load_factor < 1:
            raise ValueError(f"the load factor must be at least 1, got {load_factor}")
        self.loads = loads
        self.load_factor = load_factor
        self.replication = replication
        self._rings: dict[tuple[str, ...], HashRing] = {}
        self._turns: dict[str, itertools.count] = {}

    def pick(self, group: Group, prefix: str, exclude: Collection[str] = ()) -> Endpoint | None:
        """An endpoint for one request, or None when none is left outside `exclude`."""
        candidates = [e for e in group.endpoints if e.url not in exclude]
        if not candidates:
            return None
        strategy = group.spec.strategy
        if strategy == "PrefixHash":
            ring = self._ring(tuple(e.url for e in candidates))
            url = ring.pick(prefix, self.loads.in_flight, self.load_factor)
            return next(e for e in candidates if e.url == url)
        turn = next(self._turns.setdefault(group.spec.key, itertools.count()))
        if strategy == "RoundRobin":
            return candidates[turn % len(candidates)]
        least = min(self.loads.load(e.url) for e in candidates)
        tied = [e for e in candidates if self.loads.load(e.url) == least]
        return tied[turn % len(tied)]

    def _ring(self, urls: tuple[str, ...]) -> HashRing:
        ring = self._rings.get(urls)
        if ring is None:
            if len(self._rings) > 256:  # endpoints come and go; old rings are cheap to rebuild
                self._rings.clear()
            ring = self._rings[urls] = HashRing(urls, self.replication)
        return ring
