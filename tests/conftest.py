"""Suite-wide: how pytest-xdist shares the tests out (make test runs it with -n auto --dist loadscope)."""

from __future__ import annotations

import os

# One torch (OpenMP) thread per process. The suite runs a worker per core and more (servers, engine
# processes), so extra threads only take cores from each other, and OpenMP's idle threads spin
# between parallel regions on the tiny models' small ops. Measured on 2 cores: the greedy-parity and
# sampling tests took 52 CPU-s with the default threads, 40 with OMP_WAIT_POLICY=PASSIVE, 26 with
# one thread (and less wall time, the cores idle). Set before torch is imported; the subprocesses
# tests start (pagoda serve, engine and tensor-parallel workers) inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The operator's handlers read the resync interval once, at import, and the loader retry waits for
# that timer. Set here, not in tests/operator/conftest.py: collection imports the handlers from
# tests/kube first, which fixed the default 30 s and made the retry test wait one whole resync
# (30 s in the suite against 9 s alone). The control plane's operator process sets its own (3 s).
os.environ.setdefault("PAGODA_RESYNC_SECONDS", "0.5")

pytest_plugins = ["suite_timing"]  # the time report after --durations (tests/suite_timing.py)

# The modules of these folders share session fixtures that are expensive to build (tests/kube: a
# whole control plane; tests/router: two `pagoda serve` replicas and a router), so they go to one
# worker together instead of each worker that gets one of them building its own.
ONE_WORKER = ("tests/kube/", "tests/router/")


def pytest_xdist_auto_num_workers(config):
    """-n auto: one worker per core, and one more. The tests/kube worker spends most of its time
    waiting on the control plane (conditions, controllers, kwok), so the cores stay busy with the
    other tests meanwhile. --maxprocesses still caps it; PYTEST_XDIST_AUTO_NUM_WORKERS overrides it."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    return len(os.sched_getaffinity(0)) + 1


def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedSessionScopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            for folder in ONE_WORKER:
                if nodeid.startswith(folder):
                    return folder
            return super()._split_scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            # These folders are the longest single units of work: first out, so that nothing
            # waits for them at the end of the run (tests/kube, the longest, first of all).
            for folder in reversed(ONE_WORKER):
                if folder in self.workqueue:
                    self.workqueue.move_to_end(folder, last=False)
            super()._assign_work_unit(node)

    return SharedSessionScopes(config, log)

