"""`pagoda serve` as a subprocess, the way a user runs it: a free port, a log file, a wait for
/health, and a stop that never leaves a process behind. Shared by the suites that need a real
server process (bench, demo model, the operator's autoscaler)."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class ServeProcess:
    url: str
    process: subprocess.Popen
    log_path: Path

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def wait_healthy(self, timeout: float = 180.0) -> None:
        """Until /health answers 200; fails the test, with the log, if the process exits or stalls."""
        import pytest

        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                pytest.fail(f"`pagoda serve` exited with {self.process.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2, trust_env=False).status_code == 200:
                    return
            if time.monotonic() > deadline:
                pytest.fail(f"`pagoda serve` was not healthy within {timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(0.5)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGCONT)  # a test may have paused it (SIGSTOP)
            self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def pagoda_serve(model, *flags: str, log_path: Path, host: str = "127.0.0.1", port: int | None = None,
                 wait: bool = True, **popen) -> Iterator[ServeProcess]:
    """Start `pagoda serve MODEL --host HOST --port PORT FLAGS...`; yield it once healthy (or at once
    with wait=False); stop it on exit."""
    port = port or free_port(host)
    cmd = [sys.executable, "-m", "pagoda.runtime.cli", "serve", str(model), "--host", host, "--port", str(port),
           *flags]
    with open(log_path, "wb") as log:
        server = ServeProcess(f"http://{host}:{port}", subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                                                        **popen), Path(log_path))
        try:
            if wait:
                server.wait_healthy()
            yield server
        finally:
            server.stop()
