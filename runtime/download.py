"""`pagoda download URI DIR`: fill a model folder from a model URI (the loader Job's first step).

- `hf://org/name[@revision]`: huggingface_hub's snapshot_download into DIR, with the token from
  `HF_TOKEN` (the operator fills it from the Secret). Only what the runtime loads is fetched.
- `pvc://claim/path`: the weights are already on the claim; this only checks that DIR holds a model.

A marker file (`.pagoda-download.json`) is written last, so a folder with the marker is complete: a
retried Job skips the download, and a half-finished one is resumed by snapshot_download.

Before fetching, a dry run (the library's own) sizes what is still to download, and a volume
without room for it fails at once, naming both figures: a full claim would otherwise fail minutes
in with a bare ENOSPC. A failure's cause goes, as one line, to stderr and to `--error-file` (the
loader Job passes its termination-message path, where the operator reads it for the ModelServer's
status).

`--prune-root ROOT` (the operator passes it for a cache claim of the ModelServer's own): once DIR is
complete, every other model folder under ROOT (`ROOT/<org>/<name>/<revision>`, the layout the
serving pods read) is removed, so a claim holds one model however often its URI changes. Pods of
the old revision still running keep their files open: POSIX (and NFS's silly rename) frees them
only when the last one closes, and by then the Deployment points at the new folder.
Imports no torch, and nothing of the operator: the URI spelling lives in the runtime
(runtime/model_uri.py), which the operator imports for its volume layout.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import sys
import time
from pathlib import Path

from pagoda.runtime.model_uri import ModelURI

MARKER = ".pagoda-download.json"
# What the runtime reads: config, safetensors shards and index, tokenizer files, chat templates.
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
# Mistral's repositories hold the weights twice: Hugging Face shards (model-*.safetensors, which the
# runtime reads) and Mistral's own consolidated*.safetensors. The second copy is skipped, as vLLM
# skips it, when the first is there.
MISTRAL_FORMAT = "consolidated*.safetensors"


def second_copy(filenames: list[str]) -> list[str]:
    """ignore_patterns for a repository's files: Mistral's consolidated weights beside HF shards."""
    hf = any(fnmatch.fnmatch(n, "model*.safetensors") for n in filenames)
    mistral = any(fnmatch.fnmatch(n, MISTRAL_FORMAT) for n in filenames)
    return [MISTRAL_FORMAT] if hf and mistral else []


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("uri", help="hf://org/name[@revision] or pvc://claim/path")
    parser.add_argument("dir", help="folder to fill (created if missing)")
    parser.add_argument(
        "--force", action="store_true", help="download even if the marker says it is complete"
    )
    parser.add_argument("--max-workers", type=int, default=8, help="parallel file downloads")
    parser.add_argument(
        "--prune-root", metavar="ROOT",
        help="once DIR is complete, remove the other model folders under ROOT (ROOT/<org>/<name>/<revision>)",
    )  # fmt: skip
    parser.add_argument("--error-file", metavar="PATH",
                        help="on failure, write the cause there as one line (the loader Job's termination message)")


def is_complete(folder: Path, uri: str) -> bool:
    try:
        return json.loads((folder / MARKER).read_text()).get("uri") == uri
    except (OSError, json.JSONDecodeError):
        return False


def download(uri: str, folder: str | os.PathLike, *, force: bool = False, max_workers: int = 8) -> dict:
    """Fill folder from uri; returns what the marker records."""
    parsed = ModelURI.parse(uri)
    folder = Path(folder)
    if parsed.scheme == "pvc":
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{uri}: no config.json in {folder} (is the claim mounted there?)")
        return {"uri": uri, "skipped": "pvc:// weights are used in place"}
    if not force and is_complete(folder, uri):
        return json.loads((folder / MARKER).read_text()) | {"skipped": "already complete"}

    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import DryRunError

    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    fetch = {"repo_id": parsed.repo_id, "revision": parsed.revision, "local_dir": folder,
             "token": os.environ.get("HF_TOKEN") or None, "allow_patterns": ALLOW_PATTERNS, "max_workers": max_workers}
    try:
        planned = snapshot_download(**fetch, dry_run=True)
    except DryRunError as exc:  # it says only "cannot be accessed": the cause it wraps says why
        raise (exc.__cause__ or exc) from None
    if skip := second_copy([f.filename for f in planned]):
        fetch["ignore_patterns"] = skip
        planned = [f for f in planned if not any(fnmatch.fnmatch(f.filename, s) for s in skip)]
    check_free_space(uri, folder, planned)
    snapshot_download(**fetch)
    files = sorted(
        p for p in folder.rglob("*") if p.is_file() and ".cache" not in p.relative_to(folder).parts
    )
    record = {
        "uri": uri,
        "repo_id": parsed.repo_id,
        "revision": parsed.revision,
        "files": len(files),
        "bytes": sum(p.stat().st_size for p in files),
        "seconds": round(time.monotonic() - started, 3),
    }
    (folder / MARKER).write_text(json.dumps(record, indent=2) + "\n")
    return record


class CacheTooSmall(OSError):
    """The volume has no room for what is left to download."""


def check_free_space(uri: str, folder: Path, planned: list) -> None:
    """Refuse a download the volume cannot hold. `planned` is snapshot_download's dry run: files
    already complete in folder are not counted again (a resumed download needs only the rest)."""
    needed = sum(f.file_size or 0 for f in planned if f.will_download)
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise CacheTooSmall(
            f"{uri} needs {needed / 2**30:.2f} GiB more on the cache volume, which has {free / 2**30:.2f} GiB "
            f"free at {folder}; raise spec.cache.size (older revisions are pruned only after a complete download)"
        )


# ROOT/<org>/<name>/<revision>: model_uri.ModelURI.cache_subpath below "hf/".
MODEL_DEPTH = 3


def prune(root: str | os.PathLike, keep: str | os.PathLike) -> list[str]:
    """Remove every model folder under root but keep (which must be one of them), then the org and
    name folders left empty. Returns the removed folders, relative to root. Anything else under root
    (a stray file, a folder at another depth) is left alone."""
    root, keep = Path(root).resolve(), Path(keep).resolve()
    if len(keep.relative_to(root).parts) != MODEL_DEPTH:  # ValueError when keep is not under root
        raise ValueError(f"{keep} is not a model folder of {root} (<org>/<name>/<revision>)")
    removed = []
    for folder in sorted(root.glob("/".join("*" * MODEL_DEPTH))):
        if folder.is_dir() and not folder.is_symlink() and folder.resolve() != keep:
            shutil.rmtree(folder)
            removed.append(str(folder.relative_to(root)))
    for parent in sorted(root.glob("*/*"), reverse=True) + sorted(root.glob("*"), reverse=True):
        if parent.is_dir() and not parent.is_symlink() and not any(parent.iterdir()):
            parent.rmdir()
    return removed


# Kubernetes keeps at most 4096 bytes of a termination message; the cause fits in far less.
ERROR_CHARS = 1000


def failure_cause(exc: BaseException) -> str:
    """One line: the error's kind and its first lines (the Hub's errors add a request id and advice)."""
    text = " ".join(line.strip() for line in str(exc).splitlines()[:3] if line.strip())
    return f"{type(exc).__name__}: {text}"[:ERROR_CHARS]


def run(args: argparse.Namespace) -> int:
    try:
        record = download(args.uri, args.dir, force=args.force, max_workers=args.max_workers)
        if args.prune_root:
            record["pruned"] = prune(args.prune_root, args.dir)
    except Exception as exc:  # noqa: BLE001 - whatever stops the loader is reported, then it exits non-zero
        cause = failure_cause(exc)
        print(f"pagoda download: {cause}", file=sys.stderr)
        if args.error_file:
            Path(args.error_file).write_text(cause)
        # 2: the URI or the folder is wrong (a spec error); 1: the Hub or the volume failed.
        return 2 if isinstance(exc, ValueError | FileNotFoundError) else 1
    print(json.dumps(record))
    return 0
