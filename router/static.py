"""Static discovery: model groups and their endpoints from a YAML (or JSON) file.

    models:
      - name: pagoda-demo                 # the name the replicas serve
        aliases: [demo]                   # further names the router accepts
        endpoints: [http://10.0.0.7:8000, http://10.0.0.8:8000]
        loadBalancing: {strategy: PrefixHash, prefixCharLength: 100}

The file is read again whenever it changes, so endpoints can come and go without a restart (a held
request is released when its model gets one). There is nothing to scale: a request for a model
with no endpoints waits for the file to list one, or times out.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import yaml

from pagoda.router.discovery import Discovery
from pagoda.router.fleet import DEFAULT_PREFIX_CHAR_LENGTH, Endpoint, Fleet, GroupSpec

logger = logging.getLogger("pagoda.router")


def parse_models(doc: Any) -> list[tuple[GroupSpec, tuple[Endpoint, ...]]]:
    """The groups a static file describes; ValueError naming the entry and field on bad input."""
    models = (doc or {}).get("models") if isinstance(doc, dict) else None
    if not isinstance(models, list):
        raise ValueError("the file must hold a mapping with a `models` list")
    out, seen = [], set()
    for i, entry in enumerate(models):
        where = f"models[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise ValueError(f"{where}.name must be a non-empty string")
        name = entry["name"]
        if name in seen:
            raise ValueError(f"{where}.name {name!r} appears twice")
        seen.add(name)
        aliases = entry.get("aliases") or []
        endpoints = entry.get("endpoints") or []
        if not all(isinstance(a, str) for a in aliases):
            raise ValueError(f"{where}.aliases must be a list of strings")
        if not all(isinstance(e, str) and e.startswith(("http://", "https://")) for e in endpoints):
            raise ValueError(f"{where}.endpoints must be a list of http(s):// URLs")
        lb = entry.get("loadBalancing") or {}
        try:
            spec = GroupSpec(
                key=name,
                served_name=name,
                aliases=tuple(aliases),
                strategy=lb.get("strategy", "LeastLoad"),
                prefix_char_length=int(lb.get("prefixCharLength", DEFAULT_PREFIX_CHAR_LENGTH)),
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}.loadBalancing: {exc}") from None
        out.append((spec, tuple(Endpoint(e.rstrip("/")) for e in endpoints)))
    return out


class StaticDiscovery(Discovery):
    def __init__(self, path: Path, poll_seconds: float = 0.5):
        self.path = Path(path)
        self.poll_seconds = poll_seconds
        self._synced = asyncio.Event()
        self._stamp: tuple[int, int] | None = None
        self.load()  # a broken file fails at start-up, with its reason

    def load(self) -> list[tuple[GroupSpec, tuple[Endpoint, ...]]]:
        return parse_models(yaml.safe_load(self.path.read_text()))

    def apply(self, fleet: Fleet, groups) -> None:
        keys = {spec.key for spec, _ in groups}
        for key in [k for k in fleet.groups if k not in keys]:
            fleet.remove(key)
        for spec, endpoints in groups:
            fleet.upsert(spec)
            fleet.set_endpoints(spec.key, endpoints)

    async def run(self, fleet: Fleet) -> None:
        while True:
            try:
                stat = self.path.stat()
                stamp = (stat.st_mtime_ns, stat.st_size)
                if stamp != self._stamp:
                    self.apply(fleet, self.load())
                    self._stamp = stamp
            except (OSError, ValueError, yaml.YAMLError) as exc:
                # Keep serving what the last good file said; a half-written file is read again.
                logger.warning("static discovery: %s: %s", self.path, exc)
            self._synced.set()
            await asyncio.sleep(self.poll_seconds)

    async def wait_synced(self) -> None:
        await self._synced.wait()

    async def scale_from_zero(self, spec: GroupSpec) -> None:
        logger.info("static discovery: %s has no endpoint; waiting for %s to list one", spec.key, self.path)
