"""Model URIs (`hf://org/name[@revision]`, `pvc://claim/path`) and where each lands in the cache.

Shared by `pagoda download` (which runs in the runtime image) and the operator (its volume layout and
the CRD's rule), so it lives in the runtime, which never imports the operator, and imports nothing
beyond the standard library.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

# The one spelling of each URI kind: the CRD's CEL rule is built from these same strings (RE2 and
# Python agree on this subset), so what the API server admits is what the parser accepts.
HF_PATTERN = r"^hf://(?P<org>[A-Za-z0-9][-A-Za-z0-9_.]*)/(?P<name>[-A-Za-z0-9_.]+)(@(?P<rev>[-A-Za-z0-9_./]+))?$"
PVC_PATTERN = r"^pvc://(?P<claim>[a-z0-9]([-a-z0-9.]*[a-z0-9])?)/(?P<path>[-A-Za-z0-9_./]*)$"
_HF = re.compile(HF_PATTERN)
_PVC = re.compile(PVC_PATTERN)
# A `..` would climb out of the model's folder in the cache (and in a pvc:// claim's subPath).
PARENT = ".."

# Where the cache volume is mounted, in the loader Job and in the serving pods; hf:// models lie
# under HF_FOLDER/<org>/<name>/<revision> in it.
CACHE_MOUNT = "/models"
HF_FOLDER = "hf"


@dataclass(frozen=True, slots=True)
class ModelURI:
    scheme: str  # "hf" or "pvc"
    repo_id: str | None = None  # hf: org/name
    revision: str | None = None  # hf: branch, tag or commit; None means the default branch
    claim: str | None = None  # pvc: the claim holding the weights
    path: str = ""  # pvc: folder inside the claim

    @classmethod
    def parse(cls, uri: str) -> ModelURI:
        if PARENT in uri:
            raise ValueError(f"model uri must not contain {PARENT!r}, got {uri!r}")
        if m := _HF.fullmatch(uri):
            return cls("hf", repo_id=f"{m['org']}/{m['name']}", revision=m["rev"])
        if m := _PVC.fullmatch(uri):
            return cls("pvc", claim=m["claim"], path=m["path"].strip("/"))
        raise ValueError(f"model uri must be hf://org/name[@revision] or pvc://claim/path, got {uri!r}")

    @property
    def cache_subpath(self) -> str:
        """The model's folder relative to the volume root."""
        if self.scheme == "pvc":
            return self.path
        # Revisions may hold '/', which would nest folders; keep one folder per revision.
        rev = (self.revision or "main").replace("/", "--")
        return f"{HF_FOLDER}/{self.repo_id}/{rev}"

    @property
    def mount_path(self) -> str:
        return f"{CACHE_MOUNT}/{self.cache_subpath}".rstrip("/")

    @property
    def default_served_name(self) -> str:
        return (
            self.repo_id if self.scheme == "hf" else (self.path.rsplit("/", 1)[-1] or self.claim or "model")
        )


def uri_digest(uri: str) -> str:
    """A short stable digest: the loader Job of each URI has its own name, so a new URI reloads."""
    return hashlib.sha256(uri.encode()).hexdigest()[:8]
