"""Running the kopf operator in a test, and waiting for what it does. A module of its own, not
conftest: `from conftest import ...` resolves to whichever conftest module pytest imported first,
which breaks when another suite's conftest is collected before the operator's."""

from __future__ import annotations

import asyncio
import contextlib
import threading


@contextlib.asynccontextmanager
async def running_operator(**memo):
    """kopf.operator() on its own loop in a thread, as in production: it owns that loop and, on
    stop, cancels every task it finds there, which must not include the API server's."""
    import kopf

    import pagoda.operator.handlers  # noqa: F401 - registers the handlers

    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=lambda: asyncio.run(
            kopf.operator(
                clusterwide=True, standalone=True, stop_flag=stop, ready_flag=ready, memo=kopf.Memo(**memo)
            )
        ),
        name="kopf-operator",
        daemon=True,
    )
    thread.start()
    assert await asyncio.to_thread(ready.wait, 15), "the operator did not start"
    try:
        yield thread
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 30)
        assert not thread.is_alive(), "the operator did not stop"


async def eventually(check, timeout: float = 60.0, interval: float = 0.05):
    """Poll check() (sync, run in a thread since it may call the API) until it returns truthy. The
    deadline is a hang guard, generous for a loaded 2-core machine; nothing here times anything."""
    deadline = asyncio.get_running_loop().time() + timeout
    last = None
    while True:
        try:
            last = await asyncio.to_thread(check)
            if last:
                return last
        except (AssertionError, KeyError, TypeError) as exc:
            last = exc
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {timeout}s; last: {last!r}")
        await asyncio.sleep(interval)
