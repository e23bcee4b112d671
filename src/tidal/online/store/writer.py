"""GroupCommitter: the HTTP API's writes, many callers per transaction, acked only after commit.

    caller (event loop) ── record / submit ──> queue ──> writer thread: waits commit_window_ms
        (or until max_batch are waiting), writes every waiting request in ONE transaction,
        commits, then resolves each caller's future ── the await returns: the write is durable

One fsync per batch instead of one per event is what makes hundreds of durable events per second
cheap. A failed transaction fails every future of its batch (nothing in it was acknowledged) and
the thread goes on with the next. The backlog (feedback the learner has not reached yet) is
counted by the thread every BACKLOG_REFRESH_S, so ``retry_after`` costs nothing per request.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from concurrent.futures import Future

from tidal.online.config import StoreConfig
from tidal.online.records import FeedbackEvent, ServedResponse

log = logging.getLogger(__name__)

BACKLOG_REFRESH_S = 0.2
"""How often the writer thread re-counts the learner's backlog."""

RETRY_AFTER_S = (1.0, 5.0)
"""Retry-After range: the low end just over ``max_backlog``, the high end at twice it or more."""

_STOP = object()


class GroupCommitter:
    """One writer thread over an OnlineStore; thread-safe, its async methods for an event loop."""

    def __init__(self, store, cfg: StoreConfig, max_backlog: int):
        self.store, self.cfg, self.max_backlog = store, cfg, max_backlog
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        self._backlog = store.backlog()
        self._backlog_at = time.monotonic()
        self.batches = 0
        """Transactions committed (for the bench: requests per batch = writes / batches)."""
        self._thread = threading.Thread(target=self._run, name="tidal-group-commit", daemon=True)
        self._thread.start()

    # ---- callers ----

    def enqueue(self, kind: str, payload: list) -> Future:
        """Queue one operation; its future resolves once its transaction committed."""
        fut: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the group committer is closed")
            self._q.put((kind, payload, fut))
        return fut

    async def record(self, responses: list[ServedResponse]) -> None:
        """Record served responses; returns once they are durable."""
        await asyncio.wrap_future(self.enqueue("responses", list(responses)))

    async def submit(self, event: FeedbackEvent) -> str:
        """Store one feedback event; its FeedbackOutcome once durable ("stored") or decided."""
        (outcome,) = await asyncio.wrap_future(self.enqueue("feedback", [event]))
        return outcome

    def retry_after(self) -> float | None:
        """Seconds a feedback sender should wait (429 Retry-After) when the learner is more than
        ``max_backlog`` events behind; None otherwise."""
        over = self._backlog - self.max_backlog
        if over <= 0:
            return None
        lo, hi = RETRY_AFTER_S
        return lo + (hi - lo) * min(1.0, over / self.max_backlog)

    def close(self) -> None:
        """Write everything queued so far, then stop the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._q.put(_STOP)
        self._thread.join()

    # ---- the writer thread ----

    def _run(self) -> None:
        stop = False
        while not stop:
            batch, stop = self._collect()
            if batch:
                self._commit(batch)
            self._refresh_backlog()

    def _collect(self) -> tuple[list, bool]:
        """Wait for a first request, then up to commit_window_ms (or max_batch) for more."""
        try:
            first = self._q.get(timeout=BACKLOG_REFRESH_S)
        except queue.Empty:
            return [], False
        if first is _STOP:
            return [], True
        batch = [first]
        deadline = time.monotonic() + self.cfg.commit_window_ms / 1000
        while len(batch) < self.cfg.max_batch:
            remaining = deadline - time.monotonic()
            try:
                item = self._q.get(timeout=remaining) if remaining > 0 else self._q.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                self._q.put(_STOP)  # handled after this batch commits
                break
            batch.append(item)
        return batch, False

    def _commit(self, batch: list) -> None:
        # a caller that gave up (cancelled) before its write started is left out; from here on
        # the futures cannot be cancelled, so every one gets the batch's outcome
        batch = [item for item in batch if item[2].set_running_or_notify_cancel()]
        if not batch:
            return
        try:
            results = self.store.write_batch([(kind, payload) for kind, payload, _ in batch])
        except Exception as e:  # noqa: BLE001 - the callers get the error, the writer goes on
            log.warning("online store: a batch of %d writes failed: %s", len(batch), e)
            for _, _, fut in batch:
                fut.set_exception(e)
            return
        self.batches += 1
        self._backlog += sum(r.count("stored") for (kind, _, _), r in zip(batch, results)
                             if kind == "feedback" and not isinstance(r, Exception))
        for (_, _, fut), result in zip(batch, results):
            if isinstance(result, Exception):
                fut.set_exception(result)
            else:
                fut.set_result(result)

    def _refresh_backlog(self) -> None:
        now = time.monotonic()
        if now - self._backlog_at < BACKLOG_REFRESH_S:
            return
        self._backlog_at = now
        try:
            self._backlog = self.store.backlog()
        except Exception as e:  # noqa: BLE001 - keep the last count; writes report their own errors
            log.warning("online store: counting the backlog failed: %s", e)
