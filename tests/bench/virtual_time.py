"""An asyncio event loop in virtual time: whenever nothing is ready to run, its clock jumps to the
next timer instead of waiting. asyncio.sleep then takes no wall time, and every time the code under
test reads from loop.time() is exact, however loaded the machine is. Only for code that does no
real I/O (the load generator over an httpx.MockTransport)."""

from __future__ import annotations

import asyncio


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        super().__init__()
        self._virtual_now = 0.0
        real_select = self._selector.select

        def select(timeout=None):
            events = real_select(0)
            if not events:
                if timeout is None:
                    raise RuntimeError("deadlock: no callback is ready and no timer is pending")
                self._virtual_now += timeout  # exactly to the next timer
            return events

        self._selector.select = select

    def time(self) -> float:
        return self._virtual_now


def run_virtual(make_coro):
    """Run make_coro(loop) to completion in a fresh VirtualTimeLoop; return its result."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(make_coro(loop))
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
