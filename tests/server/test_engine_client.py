"""The engine clients on their own, in both modes: the step loop runs in its thread or process
whatever the event loop does; aborts free blocks; the engine's errors come back to the caller."""

from __future__ import annotations

import asyncio
import time

import pytest

from pagoda.runtime.engine_args import EngineArgs
from pagoda.runtime.frontend.engine_client import EngineDeadError
from pagoda.runtime.frontend.server.cli import build_engine_client
from pagoda.runtime.sampling_params import SamplingParams


@pytest.fixture(params=["thread", "process"])
async def client(request, cycle_model):
    c = build_engine_client(EngineArgs(cycle_model.path, max_model_len=512, device="cpu"), request.param,
                            log_level="warning")
    c.start()
    yield c
    await c.shutdown()


async def test_step_loop_runs_while_the_event_loop_is_blocked(client, cycle_model):
    params = SamplingParams(max_tokens=400, temperature=0)
    stream = await client.add_request("r", None, cycle_model.letters, params)
    before = len((await stream.get()).outputs[0].token_ids)
    time.sleep(1.0)  # the event loop is stuck: a slow handler, a huge tokenization...
    latest = await stream.get()  # one coalesced, cumulative output for everything generated meanwhile
    assert len(latest.outputs[0].token_ids) - before >= 10
    stream.close()  # aborts in the engine
    while client.stats()["num_running"]:
        await asyncio.sleep(0.01)
    assert client.stats()["kv_cache_usage"] == 0.0


async def test_engine_errors_surface_at_add_and_others_go_on(client, cycle_model):
    greedy = SamplingParams(max_tokens=8, temperature=0)
    ok = await client.add_request("ok", None, cycle_model.euro, greedy)
    with pytest.raises(ValueError, match="already in use"):
        await client.add_request("ok", None, cycle_model.euro, greedy)
    with pytest.raises(ValueError, match="token ids"):  # the engine's own check, raised on its side
        await client.add_request("bad", None, [10**6], greedy)
    outputs = [o async for o in ok]
    assert outputs[-1].finished and len(outputs[-1].outputs[0].token_ids) == 8


async def test_requests_after_shutdown_are_refused(client, cycle_model):
    await client.shutdown()
    assert not client.is_alive
    with pytest.raises(EngineDeadError):
        await client.add_request("late", None, cycle_model.euro, SamplingParams(max_tokens=2))
