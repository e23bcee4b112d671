"""The puller, and what is built on it: ``Puller`` brings one pool from the version it holds to a
newer one, checking every tensor before the held version moves; ``pull_to_folder`` keeps pulled
versions as folders on disk (`tidal sync pull --out`); ``predict_delivery_s`` is how long an
update takes to reach a puller over a chain of links, from first principles (the fleet
simulator's figure, without moving bytes).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from tidal.fsutil import replace_dir, write_atomic
from tidal.sync.client import (NETWORK_ERRORS, ChunkFeed, apply_form, chunk_key, digests, fetch_chunks, get_bytes,
                               get_json, read_bundle, session, verify)
from tidal.sync.config import SyncConfig
from tidal.sync.errors import SyncError, VerificationError, disk_full_error
from tidal.sync.manifest import WeightManifest, cheapest_path
from tidal.sync.tensors import TensorBits, read_safetensors_folder, write_safetensors_files


# ── The puller ────────────────────────────────────────────────────────────────────────────────────
# The puller: brings one pool from the version it holds to a newer one.
#
#     one GET /pull (the upstream plans the cheapest path: delta chain, or newest anchor + deltas,
#       and sends the manifests and small forms' data in the same answer; a subscriber's long-poll
#       is already waiting when the version appears)
#       ──> per form: chunks it did not carry over parallel range requests (verified, resumable,
#           next upstream on failure) ──> applied in place on the held arrays ──> every tensor's
#           digest checked (BLAKE3, or the hash the manifest names; undone on failure) ──> only
#           then the held version moves.
#     Old upstreams without /pull: index, then manifest and ranges per form (the same checks).
#
# A form that fails verification everywhere (a lying manifest, a delta on a base we lack) is
# avoided and the path planned again, which falls back to an anchor when one exists.

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


# ── Versions as folders ───────────────────────────────────────────────────────────────────────────
# Versions as folders on the puller's disk (`tidal sync pull --out DIR`):
#
#     DIR/v00000007/  *.safetensors (tensors byte-identical to the published ones), side files
#                     (config.json, ...), manifest.json, tidal_complete
#     DIR/LATEST      "7"
#
# A version folder is written under a hidden staging name and renamed into place with its
# completion marker; LATEST moves after that. The newest complete folder is the base of the next
# delta, re-verified against its manifest when read back.

COMPLETE_MARKER = "tidal_complete"


def version_dir(out: Path, version: int) -> Path:
    return out / f"v{version:08d}"


def read_held(out: Path) -> tuple[WeightManifest, list[TensorBits], dict[str, bytes]] | None:
    """The newest complete version in ``out`` with its tensors (verified), or None if none is
    usable (absent, incomplete or locally corrupted: then the puller starts from an anchor)."""
    try:
        folder = version_dir(out, int((out / "LATEST").read_text()))
    except (FileNotFoundError, ValueError):
        return None
    if not (folder / COMPLETE_MARKER).is_file():
        return None
    manifest = WeightManifest.from_json((folder / "manifest.json").read_bytes())
    by_name = {t.name: t for t in read_safetensors_folder(folder)}
    if set(by_name) != {t.name for t in manifest.tensors}:
        return None
    tensors = [by_name[t.name] for t in manifest.tensors]
    try:
        verify(manifest, tensors)
    except VerificationError:
        return None
    files = {f.name: (folder / f.name).read_bytes() for f in manifest.files if (folder / f.name).is_file()}
    return manifest, tensors, files


def write_version(out: Path, manifest: WeightManifest, tensors: list[TensorBits],
                  files: dict[str, bytes], keep: int = 2) -> Path:
    """Write a verified version atomically; on any write failure nothing is left half-written."""
    out.mkdir(parents=True, exist_ok=True)
    final = version_dir(out, manifest.version)
    staging = out / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        staging.mkdir()
        write_safetensors_files(tensors, staging)
        for name, data in files.items():
            (staging / name).write_bytes(data)
        (staging / "manifest.json").write_bytes(manifest.to_json())
        (staging / COMPLETE_MARKER).write_text("")
        replace_dir(staging, final)
        write_atomic(out / "LATEST", str(manifest.version).encode())
    except OSError as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise disk_full_error(e, out) from None
    for old in sorted(out.glob("v[0-9]*"))[:-keep]:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


def pull_to_folder(puller, out: Path, version: int | None = None) -> Path:
    """Pull ``version`` (default newest) into ``out``, starting from what ``out`` holds."""
    held = read_held(out)
    if held is not None:
        puller.hold(*held, verified=True)
    if out.exists() and not out.is_dir():
        raise SyncError(f"--out {out} is a file; name a folder")
    puller.pull(version)
    return write_version(out, puller.manifest, puller.tensors, puller.files)


# ── Predicting delivery time ──────────────────────────────────────────────────────────────────────
# How long one update takes to reach a puller over a chain of links, from first principles, so a
# simulator of a global deployment can give per-region delivery times without moving bytes.
#
#     subscribed puller, h hops (origin -> relay -> ... -> puller), each one-way latency L, bandwidth B:
#
#       relay hops (store and forward):   L + delta_bytes * 8 / B          each of the first h - 1
#       last hop (decoded while it streams in):
#                                         L + max(delta_bytes * 8 / B,  full_bytes / decode_bytes_per_s)
#       + overhead_s                      (the origin noticing the version; ~2 ms, tidal.sync.origin)
#
# A subscriber's request is already waiting when the version appears, so the answer costs one
# one-way latency; an ordinary (polled) pull first sends its request: ``subscribed=False`` counts
# a whole round trip per hop. The receiving CPU's work (decode, apply in place, hash every applied
# byte) is proportional to the model's bytes, not the delta's: it starts with the first byte and
# runs beside the transfer, so the last hop costs the larger of the two. Relays forward a form's
# bytes without decoding it. TCP slow start is not modelled (connections are kept open from one
# pull to the next). ``decode_bytes_per_s`` is model bytes per wall second on the puller's cores
# (decode + apply + hash together); `tidal bench sync` records it as
# ``receiver.receive_model_bytes_per_s`` beside the per-core figures.

def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise SyncError(f"predict_delivery_s: {name} must be > 0, got {value!r}")


def _non_negative(name: str, value: float) -> None:
    if not value >= 0:
        raise SyncError(f"predict_delivery_s: {name} must be >= 0, got {value!r}")


def predict_delivery_s(delta_bytes: float, full_bytes: float, bandwidth_bps: float, latency_s: float,
                       decode_bytes_per_s: float, hops: int = 1, *, subscribed: bool = True,
                       overhead_s: float = 0.0) -> float:
    """Seconds from publish to the update applied and verified at the end of ``hops`` links.

    delta_bytes: bytes on the wire (the form's data + manifest); full_bytes: the model's bytes
    (what the receiver decodes into and hashes); bandwidth_bps: bits per second of each link;
    latency_s: one-way latency of each link; decode_bytes_per_s: the receiver's model bytes per
    wall second (all its cores); hops: links in series (1 = puller at the origin's region).
    Raises SyncError naming a bad argument."""
    for name, value in (("delta_bytes", delta_bytes), ("full_bytes", full_bytes), ("latency_s", latency_s),
                        ("overhead_s", overhead_s)):
        _non_negative(name, value)
    _positive("bandwidth_bps", bandwidth_bps)
    _positive("decode_bytes_per_s", decode_bytes_per_s)
    if not isinstance(hops, int) or hops < 1:
        raise SyncError(f"predict_delivery_s: hops must be an integer >= 1, got {hops!r}")
    wire_s = delta_bytes * 8 / bandwidth_bps
    latency = latency_s if subscribed else 2 * latency_s
    relays = (hops - 1) * (latency + wire_s)
    return overhead_s + relays + latency + max(wire_s, full_bytes / decode_bytes_per_s)
