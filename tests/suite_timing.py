"""The suite's time report, printed with --durations (make test): each xdist worker's wall and CPU
seconds and its longest modules, and the modules that cost the most CPU. On 2 cores the run can end
no sooner than the busiest worker's wall total, nor than the CPU total over the cores; this says
which of the two bounds it and where.

CPU is the worker's own (its threads: in-process servers) plus that of the children it reaped (a
`pagoda serve` it stopped, kubectl calls), not processes that outlive it in a session of their own
(the control plane's). PAGODA_TEST_TIMES=FILE also writes one line per test phase (tab-separated:
worker, phase, wall, CPU, test id)."""

from __future__ import annotations

import os

import pytest

_cpu_key = pytest.StashKey[float]()
_wall: dict[tuple[str, str], float] = {}  # (worker, module) -> seconds
_cpu: dict[tuple[str, str], float] = {}


def _cpu_now() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _measured(item):
    start = _cpu_now()
    try:
        return (yield)
    finally:
        item.stash[_cpu_key] = _cpu_now() - start


# One wrapper per phase: fixtures are set up in pytest_runtest_setup and torn down in _teardown.
pytest_runtest_setup = pytest.hookimpl(wrapper=True)(_measured)
pytest_runtest_call = pytest.hookimpl(wrapper=True)(_measured)
pytest_runtest_teardown = pytest.hookimpl(wrapper=True)(_measured)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    report.cpu_s = item.stash.get(_cpu_key, 0.0)  # a plain attribute: xdist sends it to the controller
    return report


def pytest_runtest_logreport(report):
    node = getattr(report, "node", None)  # xdist sets it on the controller's copy of a report
    worker = node.gateway.id if node is not None else "main"
    if node is None and os.environ.get("PYTEST_XDIST_WORKER"):
        return  # a worker: the controller counts its reports
    key = (worker, report.nodeid.split("::")[0])
    cpu = getattr(report, "cpu_s", 0.0)
    _wall[key] = _wall.get(key, 0.0) + report.duration
    _cpu[key] = _cpu.get(key, 0.0) + cpu
    if path := os.environ.get("PAGODA_TEST_TIMES"):
        with open(path, "a") as out:
            out.write(f"{worker}\t{report.when}\t{report.duration:.2f}\t{cpu:.2f}\t{report.nodeid}\n")


def _total(table: dict, worker: str | None = None) -> float:
    return sum(s for (w, _), s in table.items() if worker in (None, w))


def pytest_terminal_summary(terminalreporter):
    if not _wall or terminalreporter.config.getoption("durations") is None:
        return
    write = terminalreporter.write_line
    terminalreporter.section("seconds per worker: wall, CPU (setup + call + teardown)")
    for worker in sorted({w for w, _ in _wall}, key=lambda w: -_total(_wall, w)):
        mine = sorted(((s, m) for (w, m), s in _wall.items() if w == worker), reverse=True)
        top = ", ".join(f"{m.removeprefix('tests/')} {s:.0f}" for s, m in mine[:3])
        write(f"{worker}: {_total(_wall, worker):6.0f} wall, {_total(_cpu, worker):6.0f} CPU, "
              f"{len(mine)} modules; longest: {top}")
    modules: dict[str, float] = {}
    for (_, m), s in _cpu.items():
        modules[m] = modules.get(m, 0.0) + s
    top = sorted(modules.items(), key=lambda kv: -kv[1])[:8]
    write(f"CPU, all workers: {_total(_cpu):.0f} s; most: " + ", ".join(f"{m.removeprefix('tests/')} {s:.0f}"
                                                                         for m, s in top))
