"""A relay: serves its region from a cache of the last K versions, filling it from an upstream
(the origin or another relay) on the first request for a form. Concurrent requests for one form
wait for a single upstream fetch, so the upstream sends each form once per relay; chunks are
verified on arrival and written atomically, and a fetch broken midway resumes from the chunks
already received."""

from __future__ import annotations

import asyncio
import hashlib
import time

from tidal.sync.client import NETWORK_ERRORS, chunk_key, fetch_chunks, get_bytes, get_json, session
from tidal.sync.config import SyncConfig
from tidal.sync.errors import SyncError
from tidal.sync.manifest import WeightManifest
from tidal.sync.origin import VersionStore


class Relay:
    def __init__(self, upstreams: list[str], cache_dir, cfg: SyncConfig | None = None):
        if not upstreams:
            raise SyncError("a relay needs at least one --upstream URL")
        self.upstreams = [u.rstrip("/") for u in upstreams]
        self.cfg = cfg or SyncConfig()
        self.store = VersionStore(cache_dir)
        self._locks: dict = {}
        self._partial: dict = {}
        self._http = None
        self._index: tuple[float, dict] | None = None
        self.bytes_fetched = [0]

    def _session(self):
        if self._http is None:
            self._http = session(self.cfg)
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def index(self) -> dict:
        """The first reachable upstream's index (reused for ``poll_interval_s``, so many pullers
        polling a relay do not multiply requests upstream); this cache's own if none answers."""
        now = time.monotonic()
        if self._index is not None and now - self._index[0] < self.cfg.poll_interval_s:
            return self._index[1]
        for up in self.upstreams:
            try:
                self._index = (now, await get_json(self._session(), f"{up}/index"))
                return self._index[1]
            except (*NETWORK_ERRORS, SyncError):
                continue
        return self.store.index()

    async def ensure(self, version: int, kind: str) -> None:
        if self.store.has(version, kind):
            return
        lock = self._locks.setdefault((version, kind), asyncio.Lock())
        async with lock:
            if not self.store.has(version, kind):
                await self._fetch_form(version, kind)

    async def _fetch_form(self, version: int, kind: str) -> None:
        errors = []
        have = self._partial.setdefault((version, kind), {})
        for up in self.upstreams:
            try:
                manifest = WeightManifest.from_json(
                    await get_bytes(self._session(), f"{up}/v/{version}/{kind}/manifest"))
                await fetch_chunks(self._session(), up, manifest, have, self.cfg, self.bytes_fetched)
                for f in manifest.files:
                    await self.ensure_blob(f.sha256)
            except (*NETWORK_ERRORS, SyncError, ValueError) as e:
                errors.append(f"{up}: {e}")
                continue
            await asyncio.to_thread(self.store.write_form, manifest,
                                    (have[chunk_key(c)] for c in manifest.chunks))
            self._partial.pop((version, kind), None)
            self.store.set_latest(version)
            self.store.collect_garbage(self.cfg.relay_cache_versions)
            return
        raise SyncError(f"relay could not fetch version {version} ({kind}): " + "; ".join(errors))

    async def ensure_blob(self, sha256: str) -> None:
        path = self.store.blob_path(sha256)
        for up in self.upstreams:
            if path.exists():
                return
            try:
                data = await get_bytes(self._session(), f"{up}/blob/{sha256}")
            except (*NETWORK_ERRORS, SyncError):
                continue
            if hashlib.sha256(data).hexdigest() == sha256:
                self.store.write_blob(data)
        if not path.exists():
            raise SyncError(f"no upstream of this relay ({', '.join(self.upstreams)}) has blob {sha256[:16]}…")
