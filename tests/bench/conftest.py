"""Fixtures for the benchmark tests: an in-process uvicorn server on a free loopback port."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import pytest
import uvicorn
from serve_process import free_port


@contextmanager
def _serve(app):
    """Run a FastAPI app with uvicorn in a thread; yield its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the stub server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def serve_app():
    """serve_app(app) is a context manager that yields the base URL of `app` served on loopback."""
    return _serve

