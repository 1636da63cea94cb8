"""The project's packaging promises: the pagoda.<folder> mapping, the stdlib `operator` left alone,
an operator install without torch, and tiny reference models that transformers can load."""

from __future__ import annotations

import ast
import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
STDLIB_OPERATOR = (
    "import operator, sys; assert operator.__file__.startswith(sys.base_prefix), operator.__file__"
)


@pytest.mark.parametrize("cwd", [ROOT, Path("/")], ids=["repo-root", "elsewhere"])
def test_import_operator_is_stdlib(cwd):
    """`operator/` would shadow the stdlib module if it were a regular package on sys.path[0].

    `python -c` and `python -m` put the working directory first on sys.path, so running them from
    the repository root is the hard case; PYTHONPATH pointing at the root is another.
    """
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for args in (["-c", STDLIB_OPERATOR], ["-m", "pagoda.runtime.cli", "--help"]):
        result = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


def test_folders_import_as_pagoda_packages():
    import pagoda.kernels
    import pagoda.operator
    import pagoda.runtime

    assert Path(pagoda.runtime.__file__).parent == ROOT / "runtime"
    assert Path(pagoda.kernels.__file__).parent == ROOT / "kernels"
    # A namespace package: its path lists the folder (plus, in editable installs, a path hook).
    assert str(ROOT / "operator") in list(pagoda.operator.__path__)


def test_console_script_lists_subcommands():
    result = subprocess.run([sys.executable, "-m", "pagoda.runtime.cli", "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    for command in ("serve", "plan", "download", "bench", "operator"):
        assert command in result.stdout


def _closure(requirements: list[Requirement], extras: set[str]) -> set[str]:
    """Every installed distribution that these requirements pull in, following installed metadata."""
    seen: set[str] = set()
    stack = [(r, extras) for r in requirements]
    while stack:
        req, active = stack.pop()
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in (active or {""})):
            continue
        name = req.name.lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            continue
        for sub in dist.requires or []:
            stack.append((Requirement(sub), set(req.extras)))
    return seen


def test_operator_extra_never_pulls_torch():
    own = [Requirement(r) for r in md.distribution("pagoda").requires or []]
    pulled = _closure(own, {"operator"})
    assert "kopf" in pulled and "kubernetes" in pulled
    assert not pulled & {"torch", "triton", "transformers", "nvidia-cublas-cu12"}, pulled
    runtime = _closure(own, {"runtime"})
    assert {"torch", "transformers", "fastapi"} <= runtime


@pytest.mark.parametrize("family", ["llama", "llama3", "mistral", "qwen2"])
def test_tiny_models_load_and_generate(tmp_path, family):
    import torch
    import transformers

    from pagoda.runtime.tools.tiny_models import build_tiny_model

    path = build_tiny_model(tmp_path / family, family, seed=3)
    assert (path / "model.safetensors.index.json").exists(), "tiny models are sharded"
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ids = tok("def fibonacci(n):", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=6, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 6
    assert tok.decode(ids[0]) == "def fibonacci(n):"
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat.endswith("<|im_start|>assistant\n")
    if family == "qwen2":
        assert model.config.tie_word_embeddings
        assert model.model.layers[0].self_attn.q_proj.bias is not None
    # Deterministic from the seed, tokenizer included.
    again = build_tiny_model(tmp_path / "again", family, seed=3)
    assert (again / "tokenizer.json").read_text() == (path / "tokenizer.json").read_text()
    a = transformers.AutoModelForCausalLM.from_pretrained(again)
    assert all(torch.equal(x, y) for x, y in zip(model.state_dict().values(), a.state_dict().values()))


def test_operator_code_imports_only_what_the_operator_extra_installs():
    """The operator image has pagoda[operator] and no torch: every third-party import under
    operator/ must come with that extra, and importing the handlers must not load torch."""
    imported = set()
    for path in (ROOT / "operator").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"pagoda", "__future__"}
    dists = md.packages_distributions()
    needed = {d.lower().replace("_", "-") for module in third_party for d in dists.get(module, [module])}
    own = [Requirement(r) for r in md.distribution("pagoda").requires or []]
    available = _closure(own, {"operator"})
    assert needed <= available, f"add to the operator extra: {sorted(needed - available)}"

    code = "import sys, pagoda.operator.handlers, pagoda.operator.main; assert 'torch' not in sys.modules"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _imports(folder: Path) -> set[str]:
    """Every absolute module name imported anywhere under folder (top-level or inside functions)."""
    names = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
    return names


def test_runtime_never_imports_the_operator():
    """The runtime image runs `pagoda download` and `pagoda serve`; the operator depends on the
    runtime (EngineArgs, model URIs), never the other way round."""
    offending = {name for name in _imports(ROOT / "runtime") if name.split(".")[:2] == ["pagoda", "operator"]}
    assert not offending, offending


def test_serving_image_needs_no_matplotlib():
    """Dockerfile.runtime installs the runtime and router extras; matplotlib comes only with `bench`."""
    extras = re.search(r'pip install "\.\[([a-z,]+)\]"', (ROOT / "Dockerfile.runtime").read_text())
    assert extras, "Dockerfile.runtime no longer installs '.[...]' as this test expects"
    own = [Requirement(r) for r in md.distribution("pagoda").requires or []]
    assert "matplotlib" not in _closure(own, set(extras[1].split(",")))
    assert "matplotlib" in _closure(own, {"bench"})
    # And what the image runs imports matplotlib at no module's top level.
    code = ("import sys, pagoda.runtime.frontend.server.app, pagoda.runtime.tools.bench.results, "
            "pagoda.runtime.tools.bench.throughput, pagoda.runtime.tools.bench.latency; "
            "assert 'matplotlib' not in sys.modules")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _imported_distributions(folders: list[str], skip: tuple[str, ...]) -> dict[str, set[str]]:
    """Third-party distribution -> the files that import it, anywhere in a module (xgrammar is
    imported inside functions), for the .py files under folders outside skip."""
    by_module = md.packages_distributions()
    found: dict[str, set[str]] = {}
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(skip):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for top in {n.split(".")[0] for n in names} - set(sys.stdlib_module_names) - {"pagoda"}:
                    for dist in by_module.get(top, [top]):
                        found.setdefault(dist.lower().replace("_", "-"), set()).add(rel)
    return found


def test_serving_image_installs_what_the_server_imports():
    """Every third-party package that the serving image's code imports comes with the extras that
    Dockerfile.runtime installs, read from pyproject.toml (not the installed metadata, which lags an
    edit). xgrammar once sat in `bench` beside matplotlib, so the image served no json_schema."""
    extras = re.search(r'pip install "\.\[([a-z,]+)\]"', (ROOT / "Dockerfile.runtime").read_text())[1].split(",")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *(r for e in extras for r in project["optional-dependencies"][e])]
    image = _closure([Requirement(r) for r in wanted], set())
    # runtime/tools/ is the bench, the tiny models and the demo: the `bench` and `test` extras' code
    imported = _imported_distributions(["runtime", "kernels", "router"], skip=("runtime/tools/",))
    assert "xgrammar" in imported and "fastapi" in imported  # the scan sees lazy and top-level imports
    missing = {dist: sorted(files)[:3] for dist, files in imported.items() if dist not in image}
    assert not missing, f"imported by the serving image's code but not installed by {extras}: {missing}"


def test_bench_result_without_matplotlib_writes_the_json(tmp_path, monkeypatch):
    from pagoda.runtime.tools.bench.results import write_result

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    called = []
    paths = write_result({"workload": "w1", "backend": "pagoda", "tokens_per_s": 1.0}, tmp_path,
                         plot=lambda record, png: called.append(png))
    assert paths["png"] is None and not called
    assert json.loads(Path(paths["json"]).read_text())["tokens_per_s"] == 1.0
