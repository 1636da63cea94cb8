"""A loopback TCP relay that records what the upstream sent on each connection: the bytes a
replica put on the wire, to compare with what a client of the router received."""

from __future__ import annotations

import asyncio
import threading

import h11
from serve_process import free_port


class Tap:
    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.recorded: list[bytearray] = []  # server-to-client bytes, one per connection
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="tap")
        self._thread.start()
        self._ready.wait(10)

    def _run(self):
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._relay, "127.0.0.1", self.port))
        self._ready.set()
        self._loop.run_forever()

    async def _relay(self, client_reader, client_writer):
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        record = bytearray()
        self.recorded.append(record)

        async def pump(reader, writer, sink=None):
            try:
                while data := await reader.read(65536):
                    if sink is not None:
                        sink += data
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                writer.close()

        await asyncio.gather(pump(client_reader, up_writer), pump(up_reader, client_writer, record))

    def responses(self) -> list[tuple[int, bytes]]:
        """(status, body) of every complete HTTP response recorded, in order, chunked encoding undone
        by h11 (a keep-alive connection carries several)."""
        out = []
        for record in self.recorded:
            conn = h11.Connection(h11.CLIENT)
            conn.receive_data(bytes(record))
            while True:
                # h11 reads a response only after a request; the real requests went the other way.
                conn.send(h11.Request(method="POST", target="/", headers=[("Host", "x"), ("Content-Length", "0")]))
                conn.send(h11.EndOfMessage())
                status, body = None, bytearray()
                event = conn.next_event()
                while isinstance(event, (h11.Response, h11.Data)):
                    if isinstance(event, h11.Response):
                        status = event.status_code
                    else:
                        body += event.data
                    event = conn.next_event()
                if not isinstance(event, h11.EndOfMessage):
                    break
                out.append((status, bytes(body)))
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    break
                conn.start_next_cycle()
        return out

    def close(self):
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
