"""The puller: brings one pool from the version it holds to a newer one.

    index (first upstream that answers) ──> cheapest path (delta chain, or newest anchor + deltas)
      ──> per form: manifest, chunks over parallel range requests (verified, resumable, next
          upstream on failure) ──> decode into a working copy ──> every tensor's sha256 checked
      ──> only then the held version moves; a failure leaves the last good version in place.

A form that fails verification everywhere (a lying manifest, a delta on a base we lack) is
avoided and the path planned again, which falls back to an anchor when one exists.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import urllib.error
import urllib.request

from tidal.sync.apply import apply_form
from tidal.sync.client import NETWORK_ERRORS, chunk_key, fetch_chunks, get_bytes, get_json, session
from tidal.sync.config import SyncConfig
from tidal.sync.errors import SyncError
from tidal.sync.manifest import WeightManifest
from tidal.sync.plan import cheapest_path
from tidal.sync.tensors import TensorBits

MAX_REPLANS = 4
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""Upstreams are asked directly, as aiohttp does by default (an http_proxy variable would
otherwise send even loopback polls through a proxy)."""


class Puller:
    def __init__(self, upstreams: list[str], cfg: SyncConfig | None = None):
        if not upstreams:
            raise SyncError("a puller needs at least one upstream URL")
        self.upstreams = [u.rstrip("/") for u in upstreams]
        self.cfg = cfg or SyncConfig()
        self.version: int | None = None
        self.tensors: list[TensorBits] | None = None
        self.manifest: WeightManifest | None = None
        self.files: dict[str, bytes] = {}
        self._received = [0]

    @property
    def bytes_fetched(self) -> int:
        """Version data bytes received so far (including those of failed responses)."""
        return self._received[0]

    def hold(self, manifest: WeightManifest, tensors: list[TensorBits], files: dict[str, bytes]) -> None:
        """Start from a version already on hand (e.g. read back from disk and verified)."""
        self.version, self.manifest, self.tensors, self.files = manifest.version, manifest, tensors, files

    def latest(self) -> int | None:
        """The newest version the first reachable upstream offers (one small blocking request)."""
        errors = []
        for up in self.upstreams:
            try:
                with NO_PROXY.open(f"{up}/latest", timeout=self.cfg.timeout_s) as r:
                    return json.loads(r.read())
            except (OSError, ValueError) as e:
                errors.append(f"{up}: {e}")
        raise SyncError("no upstream answered: " + "; ".join(errors) + " (check the --upstream URLs)")

    def pull(self, version: int | None = None) -> int:
        """Hold ``version`` (default: the newest); returns it. Raises SyncError if impossible.

        Blocking. Callable from code that runs inside an event loop (the harness's rollout calls
        it between decode steps): the transfer then gets its own loop on a helper thread, since
        a thread can run only one loop at a time.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._pull(version))
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tidal-pull") as one:
            return one.submit(asyncio.run, self._pull(version)).result()

    async def _pull(self, version: int | None) -> int:
        async with session(self.cfg) as http:
            index = await self._index(http)
            target = index["latest"] if version is None else version
            if target is None:
                raise SyncError(f"{self.upstreams[0]} has no version yet: publish one first")
            avoid: set = set()
            reasons: list[str] = []
            for _ in range(MAX_REPLANS):
                try:
                    path, _ = cheapest_path(index["forms"], target, self.version, frozenset(avoid))
                except SyncError:
                    if not reasons:
                        raise
                    break
                result = await self._follow(http, path, avoid, reasons)
                if result is not None:
                    manifest, tensors = result
                    files = await self._files(http, manifest)
                    self.version, self.manifest, self.tensors, self.files = target, manifest, tensors, files
                    return target
            raise SyncError(f"could not build version {target}: " + "; ".join(reasons))

    async def _index(self, http) -> dict:
        errors = []
        for up in self.upstreams:
            try:
                return await get_json(http, f"{up}/index")
            except (*NETWORK_ERRORS, SyncError, ValueError) as e:
                errors.append(f"{up}: {e}")
        raise SyncError("no upstream answered: " + "; ".join(errors) + " (check the --upstream URLs)")

    async def _follow(self, http, path, avoid: set, reasons: list[str]):
        """Apply the path's forms in order; None (and the bad form in ``avoid``) on a failure
        that another path may avoid."""
        tensors, manifest = self.tensors, self.manifest
        for v, kind in path:
            try:
                manifest, tensors = await self._form(http, v, kind, tensors)
            except SyncError as e:
                avoid.add((v, kind))
                reasons.append(str(e))
                return None
        return manifest, tensors

    async def _form(self, http, version: int, kind: str, base):
        """One form from the first upstream that delivers it whole and verified."""
        errors = []
        have: dict = {}
        for up in self.upstreams:
            try:
                manifest = WeightManifest.from_json(
                    await get_bytes(http, f"{up}/v/{version}/{kind}/manifest"))
                await fetch_chunks(http, up, manifest, have, self.cfg, self._received)
                tensors = await asyncio.to_thread(
                    apply_form, manifest, lambda i: have[chunk_key(manifest.chunks[i])], base, self.cfg.threads)
                return manifest, tensors
            except (*NETWORK_ERRORS, SyncError, ValueError) as e:
                errors.append(f"{up}: {e}")
        raise SyncError(f"version {version} ({kind}) failed on every upstream: " + "; ".join(errors))

    async def _files(self, http, manifest: WeightManifest) -> dict[str, bytes]:
        held = {hashlib.sha256(d).hexdigest(): d for d in self.files.values()}
        out = {}
        for f in manifest.files:
            data = held.get(f.sha256)
            for up in self.upstreams:
                if data is not None:
                    break
                try:
                    got = await get_bytes(http, f"{up}/blob/{f.sha256}")
                except (*NETWORK_ERRORS, SyncError):
                    continue
                data = got if hashlib.sha256(got).hexdigest() == f.sha256 else None
            if data is None:
                raise SyncError(f"no upstream delivered side file {f.name} (sha256 {f.sha256[:16]}…)")
            out[f.name] = data
        return out
