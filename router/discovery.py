"""Where the router learns its model groups and their ready endpoints.

Two implementations: static.py (a file listing models and endpoints; loopback tests and plain
hosts) and kube.py (watches ModelServers and their EndpointSlices). Both keep a Fleet current and
know how to wake a group that is at zero replicas.
"""

from __future__ import annotations

import abc

from pagoda.router.fleet import Fleet, GroupSpec


class Discovery(abc.ABC):
    @abc.abstractmethod
    async def run(self, fleet: Fleet) -> None:
        """Keep `fleet` current until cancelled. Returns only when cancelled."""

    @abc.abstractmethod
    async def wait_synced(self) -> None:
        """Until the first full listing is in the fleet, so the router never 404s a known model."""

    @abc.abstractmethod
    async def scale_from_zero(self, spec: GroupSpec) -> None:
        """Ask for `spec.scale_from_zero_replicas` replicas of a group that has none ready."""
