"""Result files: one JSON object per workload and backend, plus a PNG plot (BENCHMARKS.md).

Each record carries what makes a figure reproducible and comparable: the command, the git commit,
the GPU, and the torch/triton/transformers versions, read without importing torch (the serving
load generator may run where torch is absent).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

DEFAULT_OUT_DIR = Path("e2e") / "results"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def git_commit() -> str:
    """HEAD (with "-dirty" when the tree has changes), or $PAGODA_COMMIT where there is no .git."""
    if os.environ.get("PAGODA_COMMIT"):
        return os.environ["PAGODA_COMMIT"]
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here, capture_output=True, text=True, timeout=10,
        ).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def gpu_name() -> str:
    """The GPU this process sees: torch's name if torch is loaded, else nvidia-smi's, else "cpu"."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.cuda.current_device())
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip().splitlines()
        if out:
            return out[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "cpu"


def environment() -> dict:
    return {
        "gpu": gpu_name(),
        "commit": git_commit(),
        "torch": _version("torch"),
        "triton": _version("triton"),
        "transformers": _version("transformers"),
        "python": platform.python_version(),
        "host": platform.node(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def command_line(args) -> str:
    """The full command, rebuilt from the parsed flags (defaults included), so that the record says
    exactly what ran however the CLI was entered (a shell, a script, or `main([...])` in a test)."""
    parser = getattr(args, "_parser", None)
    words = ["pagoda", "bench", args.bench]
    if parser is None:
        return shlex.join(words + sys.argv[1:])
    positionals = []
    for action in parser._actions:
        if action.dest in ("help",) or action.dest.startswith("_"):
            continue
        value = getattr(args, action.dest, None)
        if not action.option_strings:
            positionals += [str(v) for v in (value if isinstance(value, list) else [value])]
        elif isinstance(action, argparse.BooleanOptionalAction):
            # both spellings of an engine switch (--gemm-glu / --no-gemm-glu): the one that ran
            flags = sorted(action.option_strings, key=lambda f: f.startswith("--no-"))
            if value is not None:
                words.append(flags[0] if value else flags[-1])
        elif action.nargs == 0:
            if value is not None and value != action.default:  # store_true, store_false, store_const
                words.append(action.option_strings[-1])
        elif value is not None:
            words.append(action.option_strings[-1])
            if isinstance(value, tuple):  # a LO:HI range
                words.append(":".join(str(v) for v in value))
            else:
                words += [str(v) for v in value] if isinstance(value, list) else [str(value)]
    return shlex.join(words + positionals)


def result_path(out_dir: str | Path, workload: str, backend: str, suffix: str = ".json") -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(out_dir) / f"{workload}-{backend}-{stamp}{suffix}"


def precision_tag(record: dict) -> str:
    """'-fp8' for FP8 weights, '-kvfp8' for an FP8 KV cache, in the result's file name
    (W2-pagoda-fp8-<stamp>.json), so FP8 runs never pass for bf16 ones."""
    tag = "-fp8" if record.get("quantization") == "fp8" else ""
    return tag + ("-kvfp8" if record.get("kv_cache_dtype") not in (None, "auto") else "")


def write_result(record: dict, out_dir: str | Path | None = None, plot=None) -> dict:
    """Write `record` (which has at least workload, backend and the figures) as JSON next to a PNG
    made by `plot(record, png_path)`. Returns {"json": path, "png": path or None}. The PNG needs
    matplotlib (the `bench` extra); the serving image has none, and there only the JSON is written."""
    out_dir = Path(out_dir) if out_dir is not None else DEFAULT_OUT_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    full = {"workload": record["workload"], "backend": record["backend"], **environment(), **record}
    json_path = result_path(out_dir, full["workload"], full["backend"] + precision_tag(full))
    try:
        import matplotlib
    except ImportError:
        matplotlib = None
    png_path = json_path.with_suffix(".png") if plot is not None and matplotlib is not None else None
    if png_path is not None:
        full["plot"] = png_path.name
    json_path.write_text(json.dumps(full, indent=2) + "\n")
    if png_path is not None:
        matplotlib.use("Agg")
        plot(full, png_path)
    note = f" and {png_path.name}" if png_path else " (no plot: pip install 'pagoda[bench]' for matplotlib)" if plot else ""
    print(f"wrote {json_path}{note}")
    return {"json": json_path, "png": png_path}

