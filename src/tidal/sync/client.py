"""HTTP fetching of one form's chunks: several parallel range requests, every chunk checked
against its xxh3 as soon as its bytes arrive, and what was verified kept across retries and
upstreams, so a broken connection costs only the chunks not yet received."""

from __future__ import annotations

import asyncio
import json
import threading

import aiohttp
import xxhash

from tidal.sync.config import SyncConfig
from tidal.sync.errors import SyncError, VerificationError
from tidal.sync.manifest import ChunkEntry, WeightManifest

NETWORK_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, asyncio.IncompleteReadError, OSError)
"""What a broken, refused, truncated or stalled connection raises."""

ChunkKey = tuple[int, int, str]
"""(offset, length, xxh3): a verified payload is reusable wherever a manifest names the same."""


def chunk_key(c: ChunkEntry) -> ChunkKey:
    return (c.offset, c.length, c.xxh3)


class ChunkFeed(dict):
    """Verified payloads by chunk key (filled on the event loop) that another thread can wait
    for, so the puller applies each chunk while later ones are still on the wire."""

    def __init__(self):
        super().__init__()
        self._arrived = threading.Condition()
        self._error: BaseException | None = None
        self._released = False

    def __setitem__(self, key: ChunkKey, payload: bytes) -> None:
        with self._arrived:
            super().__setitem__(key, payload)
            self._arrived.notify_all()

    def wait_for(self, key: ChunkKey) -> bytes:
        """The payload once it has arrived; raises the error the feed was closed with if it has
        not arrived by then."""
        with self._arrived:
            self._arrived.wait_for(lambda: key in self or self._error is not None)
            if key in self:
                return dict.__getitem__(self, key)
            raise self._error

    def close(self, error: BaseException) -> None:
        """No more payloads will come, and the result will not be used: wake every waiter for a
        payload that is missing, and ``wait_released`` raises ``error``."""
        with self._arrived:
            self._error = error
            self._arrived.notify_all()

    def release(self) -> None:
        """The result will be used: ``wait_released`` returns."""
        with self._arrived:
            self._released = True
            self._arrived.notify_all()

    def wait_released(self) -> None:
        """Blocks until ``release`` (returns) or ``close`` (raises its error)."""
        with self._arrived:
            self._arrived.wait_for(lambda: self._released or self._error is not None)
            if not self._released:
                raise self._error


def session(cfg: SyncConfig) -> aiohttp.ClientSession:
    timeout = aiohttp.ClientTimeout(sock_connect=cfg.timeout_s, sock_read=cfg.timeout_s)
    return aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=cfg.connections * 2))


async def get_bytes(http: aiohttp.ClientSession, url: str) -> bytes:
    """A whole small answer (index, manifest, blob). A kept-alive connection that the server
    closed meanwhile (it restarted) is retried once on a new one."""
    try:
        return await _get_bytes(http, url)
    except aiohttp.ClientConnectionError:
        return await _get_bytes(http, url)


async def _get_bytes(http: aiohttp.ClientSession, url: str) -> bytes:
    async with http.get(url) as resp:
        if resp.status == 404:
            raise SyncError(f"{url} was not found (404): {(await resp.text())[:200]}")
        if resp.status != 200:
            raise SyncError(f"{url} answered HTTP {resp.status}: {(await resp.text())[:200]}")
        return await resp.read()


async def get_json(http: aiohttp.ClientSession, url: str):
    return json.loads(await get_bytes(http, url))


def range_groups(chunks: list[tuple[int, ChunkEntry]], request_bytes: int) -> list[list[tuple[int, ChunkEntry]]]:
    """Adjacent chunks grouped into requests of up to ``request_bytes`` (a chunk is never split)."""
    groups: list[list[tuple[int, ChunkEntry]]] = []
    for i, c in chunks:
        last = groups[-1] if groups else None
        if (last and last[-1][0] == i - 1
                and c.offset + c.length - last[0][1].offset <= request_bytes):
            last.append((i, c))
        else:
            groups.append([(i, c)])
    return groups


async def fetch_group(http: aiohttp.ClientSession, url: str, group, have: dict[ChunkKey, bytes],
                      received: list[int]) -> None:
    """One range request; stores each chunk that verifies; adds the bytes read to received[0]
    (also those of a response that breaks off or fails a check)."""
    first, last = group[0][1], group[-1][1]
    headers = {"Range": f"bytes={first.offset}-{last.offset + last.length - 1}"}
    async with http.get(url, headers=headers) as resp:
        if resp.status != 206:
            raise SyncError(f"{url} answered HTTP {resp.status} to a range request")
        await read_verified(resp.content, group, have, received, url)


async def read_verified(content: asyncio.StreamReader, chunks, have: dict[ChunkKey, bytes],
                        received: list[int], source: str) -> None:
    """Read ``chunks`` ((index, entry) pairs) back to back from ``content``, keeping each that
    passes its xxh3; raises at the first that breaks off or fails."""
    for i, c in chunks:
        try:
            payload = await content.readexactly(c.length)
        except asyncio.IncompleteReadError as e:
            received[0] += len(e.partial)
            raise
        received[0] += c.length
        if xxhash.xxh3_64_hexdigest(payload) != c.xxh3:
            raise VerificationError(f"chunk {i} from {source} fails its checksum")
        have[chunk_key(c)] = payload


async def fetch_chunks(http: aiohttp.ClientSession, base_url: str, manifest: WeightManifest,
                       have: dict[ChunkKey, bytes], cfg: SyncConfig, received: list[int]) -> None:
    """Fill ``have`` with every chunk of ``manifest`` from ``base_url``; the bytes read (good or
    bad) are added to ``received[0]``."""
    url = f"{base_url}/v/{manifest.version}/{manifest.kind}/data"
    limit = asyncio.Semaphore(cfg.connections)
    last_error = None

    async def one(group) -> None:
        nonlocal last_error
        async with limit:
            try:
                await fetch_group(http, url, group, have, received)
            except (*NETWORK_ERRORS, SyncError) as e:
                last_error = e

    for attempt in range(cfg.retries + 1):
        missing = [(i, c) for i, c in enumerate(manifest.chunks) if chunk_key(c) not in have]
        if not missing:
            return
        if attempt:
            await asyncio.sleep(min(0.05 * 2 ** attempt, 1.0))
        # Spread the bytes over every connection (each has its own TCP slow start on a long link).
        spread = -(-sum(c.length for _, c in missing) // cfg.connections)
        await asyncio.gather(*(one(g) for g in range_groups(missing, min(cfg.request_bytes, max(spread, 1)))))
    missing = sum(chunk_key(c) not in have for c in manifest.chunks)
    if not missing:
        return
    raise SyncError(f"{missing} chunk(s) of version {manifest.version} ({manifest.kind}) could not be "
                    f"fetched from {base_url} after {cfg.retries + 1} tries; last error: "
                    f"{type(last_error).__name__}: {last_error}")
