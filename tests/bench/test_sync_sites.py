"""e2e/w4_gap_trace.py --syncs: the synchronizing CUDA calls of a run, counted by the innermost frame
of the runtime's own code that made them, with the engine steps the run took. On the CPU, torch's
sync debug mode is stubbed and the "synchronizing call" is the warning it would raise, made from a
function compiled as if it lived in runtime/."""

import importlib.util
import warnings
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[2]


def load_script():
    spec = importlib.util.spec_from_file_location("w4_gap_trace", ROOT / "e2e" / "w4_gap_trace.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sync_sites_counts_by_runtime_frame_and_steps(monkeypatch):
    script = load_script()
    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    code = "import warnings\ndef wait():\n    warnings.warn('called a synchronizing CUDA operation')\n" \
           "def item():\n    warnings.warn('called a synchronizing CUDA operation')\n"
    fake = {}
    exec(compile(code, "/copy/of/the/tree/runtime/worker/fake_runner.py", "exec"), fake)

    class Engine:
        def step(self):
            fake["wait"]()
            return []

    llm = SimpleNamespace(llm_engine=Engine())

    def run():
        for _ in range(3):
            llm.llm_engine.step()
        fake["item"]()
        warnings.warn("from outside the runtime", stacklevel=1)

    got = script.sync_sites(run, llm)
    assert modes == ["warn", "default"]  # the debug mode is handed back
    assert got["steps"] == 3 and "step" not in vars(llm.llm_engine)  # the counting wrapper is gone
    sites = {s["site"]: s["calls"] for s in got["sites"]}
    assert sites == {"fake_runner.py:3 wait": 3, "fake_runner.py:5 item": 1, "outside the runtime": 1}
    assert got["sites"][0]["stack"][-1] == "fake_runner.py:3 wait"
