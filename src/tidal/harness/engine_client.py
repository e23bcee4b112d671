"""Many episodes, one engine: each awaits its own generation; one driver steps the engine.

    episode coroutines ──generate(req)──> engine.submit ──> future
    driver: while requests are pending: before_step(); engine.step() ──> resolve finished futures

The engine is not thread-safe, so only the driver (on the event loop) touches it; continuous
batching does the rest: a request submitted while others decode joins the next step. Episodes
advance turn by turn at their own pace; while one runs a tool in a thread, the others decode.
"""

from __future__ import annotations

import asyncio
import time

from tidal.engine.request import GenerationRequest, GenerationResult


class EngineClient:
    def __init__(self, engine, before_step=None):
        self.engine = engine
        self.before_step = before_step
        self._pending: dict[int, asyncio.Future] = {}
        self._wake = asyncio.Event()
        self.engine_s = 0.0
        """Seconds spent inside engine steps (generation time)."""

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        future = asyncio.get_running_loop().create_future()
        self._pending[self.engine.submit(request)] = future
        self._wake.set()
        return await future

    async def drive(self) -> None:
        """Step the engine whenever requests are pending; runs until cancelled."""
        while True:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            if self.before_step is not None:
                self.before_step()
            t = time.perf_counter()
            finished = self.engine.step()
            self.engine_s += time.perf_counter() - t
            for result in finished:
                future = self._pending.pop(result.request_id, None)
                if future is None:
                    raise RuntimeError(f"engine returned request {result.request_id}, which no "
                                       "episode submitted: the engine must not be shared while "
                                       "episodes run")
                if not future.done():  # its episode may have been cancelled
                    future.set_result(result)
            await asyncio.sleep(0)  # let the episodes whose turns finished go on
