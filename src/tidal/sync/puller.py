"""The puller: brings one pool from the version it holds to a newer one.

    one GET /pull (the upstream plans the cheapest path: delta chain, or newest anchor + deltas,
      and sends the manifests and small forms' data in the same answer; a subscriber's long-poll
      is already waiting when the version appears)
      ──> per form: chunks it did not carry over parallel range requests (verified, resumable,
          next upstream on failure) ──> applied in place on the held arrays ──> every tensor's
          digest checked (BLAKE3, or the hash the manifest names; undone on failure) ──> only
          then the held version moves.
    Old upstreams without /pull: index, then manifest and ranges per form (the same checks).

A form that fails verification everywhere (a lying manifest, a delta on a base we lack) is
avoided and the path planned again, which falls back to an anchor when one exists.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
import urllib.error
import urllib.request

from tidal.sync.apply import apply_form, digests
from tidal.sync.bundle import read_bundle
from tidal.sync.client import NETWORK_ERRORS, ChunkFeed, chunk_key, fetch_chunks, get_bytes, get_json, session
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
        self.timeline: dict[str, float] = {}
        """time.time() of the last pull's request_sent, first_byte, last_byte, decode_done,
        hash_done, applied (the benchmark prints it)."""
        self._digests: list[str] | None = None
        """Digest of each held tensor's bytes (verified) by ``self.manifest.hash``, so unchanged
        tensors are not re-hashed."""
        self._received = [0]
        self._streams: dict[tuple, tuple[ChunkFeed, asyncio.Future]] = {}
        """Forms being applied while their /pull answer still arrives: step -> (feed, task)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._http = None
        self._busy = threading.Lock()

    @property
    def bytes_fetched(self) -> int:
        """Version data bytes received so far (including those of failed responses)."""
        return self._received[0]

    def hold(self, manifest: WeightManifest, tensors: list[TensorBits], files: dict[str, bytes],
             verified: bool = False) -> None:
        """Start from a version already on hand (e.g. read back from disk). Its arrays are
        updated in place by later pulls. Unless ``verified`` (its bytes were just checked against
        ``manifest``), the tensors are hashed here: a later delta re-hashes only the tensors it
        changes and takes the others' digests from this, so they must be the bytes' own."""
        self.version, self.manifest, self.tensors, self.files = manifest.version, manifest, tensors, files
        self._digests = ([t.digest for t in manifest.tensors] if verified
                         else digests(tensors, threads=self.cfg.threads, hash=manifest.hash))

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

        Blocking; callable from any thread, also one running an event loop (the harness's
        rollout calls it between decode steps): transfers run on the puller's own loop thread,
        which keeps its HTTP connections open from one pull to the next."""
        return self._run(self._pull(version, None, 0.0))

    def pull_next(self, wait_s: float) -> int | None:
        """Subscribe: wait up to ``wait_s`` seconds for a version newer than the one held, and
        hold it as soon as it is published (its manifest and data come in the answer to the
        request already waiting). Returns the new version, or None if none appeared."""
        after = -1 if self.version is None else self.version
        return self._run(self._pull(None, after, wait_s))

    def close(self) -> None:
        """Close the kept-open connections and stop the loop thread (pulling again restarts them)."""
        loop, http = self._loop, self._http
        self._loop = self._http = None
        if loop is None or loop.is_closed():
            return

        async def shut() -> None:
            if http is not None:
                await http.close()
            loop.stop()

        asyncio.run_coroutine_threadsafe(shut(), loop)  # not waited for: also safe from __del__

    def __del__(self) -> None:
        self.close()

    def _run(self, coro):
        with self._busy:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, daemon=True, name="tidal-pull").start()
            return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _session(self):
        if self._http is None or self._http.closed:
            self._http = session(self.cfg)
        return self._http

    async def _pull(self, version: int | None, after: int | None, wait_s: float) -> int | None:
        try:
            return await self._pull_path(version, after, wait_s)
        finally:
            await self._abandon_all()

    async def _pull_path(self, version: int | None, after: int | None, wait_s: float) -> int | None:
        http = self._session()
        self.timeline = {"request_sent": time.time()}
        target, path, prefetched = None, None, {}
        for up in self.upstreams:
            try:
                answer = await self._bundle(http, up, version, after, wait_s)
            except (*NETWORK_ERRORS, SyncError, ValueError):
                await self._abandon_all()
                continue  # an old upstream without /pull, or a broken answer: plan it by hand
            if answer is None:
                return None
            target, forms = answer
            path = [step for step, _, _ in forms]
            prefetched = {step: (manifest, have) for step, manifest, have in forms}
            break
        index = None
        if target is None:
            index = await self._index(http)
            target = index["latest"] if version is None else version
            if target is None:
                raise SyncError(f"{self.upstreams[0]} has no version yet: publish one first")
            if after is not None and target <= after:
                return None
        avoid: set = set()
        reasons: list[str] = []
        for _ in range(MAX_REPLANS):
            if path is None:
                index = index or await self._index(http)
                try:
                    path, _ = cheapest_path(index["forms"], target, self.version, frozenset(avoid))
                except SyncError:
                    if not reasons:
                        raise
                    break
            if await self._follow(http, path, avoid, reasons, prefetched):
                self.timeline["applied"] = time.time()
                return target
            path = None
        raise SyncError(f"could not build version {target}: " + "; ".join(reasons))

    async def _bundle(self, http, up: str, version: int | None, after: int | None, wait_s: float):
        """GET /pull: (target, forms with what the answer carried), or None if a subscription's
        wait ended with no newer version."""
        query = {"held": "" if self.version is None else str(self.version),
                 "inline_bytes": str(self.cfg.inline_bytes)}
        if version is not None:
            query["version"] = str(version)
        if after is not None:
            # The server answers before the client's read timeout would fire.
            query.update(after=str(after), wait_s=str(min(wait_s, self.cfg.timeout_s / 2)))
        async with http.get(f"{up}/pull", params=query) as resp:
            if resp.status == 204:
                return None
            if resp.status != 200:
                raise SyncError(f"{up}/pull answered HTTP {resp.status}: {(await resp.text())[:200]}")
            return await read_bundle(resp.content, self._received, self.timeline, self._stream)

    def _stream(self, step: tuple, manifest: WeightManifest, feed: ChunkFeed) -> None:
        """Start applying the answer's first form (whose base is the held version) while its
        chunks still arrive: each chunk is decoded, and each tensor hashed, as soon as it can be.
        The result is kept only once ``_form`` releases it (every chunk and side file arrived)."""
        task = asyncio.ensure_future(asyncio.to_thread(
            apply_form, manifest, lambda i: feed.wait_for(chunk_key(manifest.chunks[i])), self.tensors,
            self.cfg.threads, self._known(manifest), self.timeline, feed.wait_released))
        self._streams[step] = (feed, task)

    def _known(self, manifest: WeightManifest) -> list[str] | None:
        """The held tensors' digests when they are by the hash ``manifest`` names (a version by
        another hash re-hashes every tensor)."""
        if self._digests is None or self.manifest is None or self.manifest.hash != manifest.hash:
            return None
        return self._digests

    async def _abandon_all(self) -> None:
        streams, self._streams = list(self._streams.values()), {}
        for feed, task in streams:
            await self._abandon(feed, task)

    @staticmethod
    async def _abandon(feed: ChunkFeed, task: asyncio.Future) -> None:
        """Stop a streamed apply whose result will not be used; it undoes what it applied."""
        feed.close(SyncError("the transfer was abandoned"))
        try:
            await task
        except Exception:
            pass  # its failure is why it is abandoned, or it was stopped by close()

    async def _index(self, http) -> dict:
        errors = []
        for up in self.upstreams:
            try:
                return await get_json(http, f"{up}/index")
            except (*NETWORK_ERRORS, SyncError, ValueError) as e:
                errors.append(f"{up}: {e}")
        raise SyncError("no upstream answered: " + "; ".join(errors) + " (check the --upstream URLs)")

    async def _follow(self, http, path, avoid: set, reasons: list[str], prefetched: dict) -> bool:
        """Apply the path's forms in order, the held version moving after each verified one;
        False (and the bad form in ``avoid``) on a failure that another path may avoid."""
        for v, kind in path:
            try:
                manifest, tensors, files = await self._form(http, v, kind, prefetched.pop((v, kind), (None, {})))
            except SyncError as e:
                avoid.add((v, kind))
                reasons.append(str(e))
                return False
            self.version, self.manifest, self.tensors, self.files = v, manifest, tensors, files
            self._digests = [t.digest for t in manifest.tensors]  # verified equal to the bytes'
        return True

    async def _form(self, http, version: int, kind: str, prefetched):
        """One form from the first upstream that delivers it whole and verified (what a /pull
        answer already carried is not fetched again)."""
        errors = []
        manifest, have = prefetched
        stream = self._streams.pop((version, kind), None)
        for up in self.upstreams:
            try:
                if manifest is None:
                    manifest = WeightManifest.from_json(
                        await get_bytes(http, f"{up}/v/{version}/{kind}/manifest"))
                files = await self._files(http, manifest)
                await fetch_chunks(http, up, manifest, have, self.cfg, self._received)
                if stream is not None:
                    stream[0].release()
                    tensors = await stream[1]
                else:
                    tensors = await asyncio.to_thread(
                        apply_form, manifest, lambda i: have[chunk_key(manifest.chunks[i])], self.tensors,
                        self.cfg.threads, self._known(manifest), self.timeline)
                return manifest, tensors, files
            except (*NETWORK_ERRORS, SyncError, ValueError) as e:
                errors.append(f"{up}: {e}")
                manifest = None  # the next upstream's own manifest (verified chunks stay in have)
                if stream is not None:
                    await self._abandon(*stream)
                    stream = None
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
