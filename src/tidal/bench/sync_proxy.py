"""A TCP proxy that adds a fixed one-way delay in each direction (`tidal bench sync`'s WAN link:
this kernel has no netem, so the round-trip time is added in user space).

    python -m tidal.bench.sync_proxy LISTEN_HOST:PORT TARGET_HOST:PORT ONE_WAY_DELAY_S
"""

from __future__ import annotations

import asyncio
import sys
import time

READ_BYTES = 1 << 18


async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy bytes, each piece released ``delay`` seconds after it arrived (order kept)."""
    queue: asyncio.Queue = asyncio.Queue()

    async def receive():
        while data := await reader.read(READ_BYTES):
            queue.put_nowait((time.monotonic() + delay, data))
        queue.put_nowait((time.monotonic() + delay, b""))

    async def send():
        while True:
            due, data = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        writer.close()

    await asyncio.gather(receive(), send(), return_exceptions=True)


async def main(listen: str, target: str, delay: float) -> None:
    thost, tport = target.rsplit(":", 1)

    async def handle(client_reader, client_writer):
        await asyncio.sleep(delay)  # the connection request travelling to the server
        try:
            up_reader, up_writer = await asyncio.open_connection(thost, int(tport))
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(pump(client_reader, up_writer, delay), pump(up_reader, client_writer, delay))

    lhost, lport = listen.rsplit(":", 1)
    server = await asyncio.start_server(handle, lhost, int(lport))
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
