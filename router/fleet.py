"""What the router knows: the model groups (one per ModelServer), their names and ready endpoints.

Discovery (static.py, kube.py) writes it; the proxy reads it. Everything here runs on the event
loop, so it needs no locks; a discovery that watches from threads hands its updates over with
`loop.call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

STRATEGIES = ("LeastLoad", "PrefixHash", "RoundRobin")
DEFAULT_PREFIX_CHAR_LENGTH = 100  # KubeAI's default


@dataclass(slots=True, frozen=True)
class Endpoint:
    """One ready replica: where to send requests, and a name for metrics and logs."""

    url: str  # http://host:port, no trailing slash
    name: str = ""

    @property
    def label(self) -> str:
        return self.name or self.url


@dataclass(slots=True, frozen=True)
class GroupSpec:
    """A ModelServer as the router sees it."""

    key: str  # namespace/name, or a static model's own name
    served_name: str  # the name the replicas answer to
    aliases: tuple[str, ...] = ()
    strategy: str = "LeastLoad"
    prefix_char_length: int = DEFAULT_PREFIX_CHAR_LENGTH
    # Replicas to ask for when a request arrives at zero (the ModelServer's minimum active replicas).
    scale_from_zero_replicas: int = 1
    replicas: int | None = None  # spec.replicas, when discovery knows it

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")
        if self.prefix_char_length < 1:
            raise ValueError(f"prefixCharLength must be at least 1, got {self.prefix_char_length}")

    @property
    def names(self) -> tuple[str, ...]:
        return (self.served_name, *(a for a in self.aliases if a != self.served_name))


@dataclass(slots=True)
class Group:
    spec: GroupSpec
    endpoints: tuple[Endpoint, ...] = ()
    # Set while the group has at least one endpoint; held requests wait on it.
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    def set_endpoints(self, endpoints: tuple[Endpoint, ...]) -> None:
        self.endpoints = endpoints
        if endpoints:
            self.ready.set()
        else:
            self.ready.clear()


class Fleet:
    def __init__(self):
        self.groups: dict[str, Group] = {}
        self._by_name: dict[str, str] = {}
        self._pending: dict[str, tuple[Endpoint, ...]] = {}  # endpoints seen before their group

    def upsert(self, spec: GroupSpec) -> Group:
        group = self.groups.get(spec.key)
        if group is None:
            group = self.groups[spec.key] = Group(spec)
            group.set_endpoints(self._pending.pop(spec.key, ()))
        group.spec = spec
        self._reindex()
        return group

    def remove(self, key: str) -> None:
        group = self.groups.pop(key, None)
        if group is not None:
            group.set_endpoints(())
            self._reindex()

    def set_endpoints(self, key: str, endpoints: tuple[Endpoint, ...]) -> None:
        endpoints = tuple(sorted(set(endpoints), key=lambda e: e.url))
        if key in self.groups:
            self.groups[key].set_endpoints(endpoints)
        else:
            self._pending[key] = endpoints

    def lookup(self, model: str) -> Group | None:
        key = self._by_name.get(model)
        return self.groups.get(key) if key is not None else None

    def names(self) -> list[tuple[str, Group]]:
        return sorted((name, self.groups[key]) for name, key in self._by_name.items())

    def _reindex(self) -> None:
        # A name two groups claim goes to the first by key, so the choice does not depend on
        # the order the watch delivered them in.
        by_name: dict[str, str] = {}
        for key in sorted(self.groups):
            for name in self.groups[key].spec.names:
                by_name.setdefault(name, key)
        self._by_name = by_name
