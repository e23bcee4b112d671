"""What serves versions: the folder of published versions (``VersionStore``, which a relay uses
as its cache too), the ``Publisher`` that writes each new version into it as a delta and/or an
anchor, and the HTTP origin over it (``make_app``, run by ``ServerThread`` or ``serve_forever``;
a relay plugs into the same server to fetch what its cache misses).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash
from aiohttp import web

from tidal.fsutil import replace_dir, write_atomic
from tidal.sync.client import HEADER_LENGTH, apply_form, layout
from tidal.sync.codec import encode_chunk
from tidal.sync.config import SyncConfig
from tidal.sync.errors import SyncError, disk_full_error
from tidal.sync.manifest import ChunkEntry, FileEntry, TensorEntry, WeightManifest, cheapest_path
from tidal.sync.tensors import TensorBits

if TYPE_CHECKING:
    from tidal.sync.relay import Relay


# ── The version store ─────────────────────────────────────────────────────────────────────────────
# A folder of published versions: what an origin serves and a relay caches (same layout).
#
#     ROOT/v00000007/delta/manifest.json, data.bin    (delta against the manifest's base_version)
#     ROOT/v00000010/anchor/manifest.json, data.bin   (full snapshot; a version may have both)
#     ROOT/blobs/<sha256>                             side files (config.json, ...) by content
#     ROOT/LATEST                                      newest complete version number
#
# Each form is written into a hidden staging folder and renamed into place (manifest written last
# inside it), and LATEST moves only after that, so a reader never sees half a version.

KINDS = ("delta", "anchor")


class VersionStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        self._forms: dict[tuple[str, str], dict] = {}

    def form_dir(self, version: int, kind: str) -> Path:
        return self.root / f"v{version:08d}" / kind

    def manifest_path(self, version: int, kind: str) -> Path:
        return self.form_dir(version, kind) / "manifest.json"

    def data_path(self, version: int, kind: str) -> Path:
        return self.form_dir(version, kind) / "data.bin"

    def blob_path(self, sha256: str) -> Path:
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise SyncError(f"{sha256!r} is not a sha256 hex digest")
        return self.root / "blobs" / sha256

    # ---------------------------------------------------------------- writing

    def write_form(self, manifest: WeightManifest, payloads) -> None:
        """Write one form of a version: ``payloads`` yields the chunk payloads in manifest order."""
        final = self.form_dir(manifest.version, manifest.kind)
        staging = final.parent / f".{manifest.kind}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            staging.mkdir(parents=True)
            with open(staging / "data.bin", "wb") as f:
                for payload in payloads:
                    f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            (staging / "manifest.json").write_bytes(manifest.to_json())
            replace_dir(staging, final)
        except OSError as e:
            shutil.rmtree(staging, ignore_errors=True)
            raise disk_full_error(e, self.root) from None

    def write_blob(self, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        path = self.blob_path(sha)
        if not path.exists():
            write_atomic(path, data)
        return sha

    def set_latest(self, version: int) -> None:
        current = self.latest()
        if current is None or version > current:
            write_atomic(self.root / "LATEST", str(version).encode())

    # ---------------------------------------------------------------- reading

    def latest(self) -> int | None:
        try:
            return int((self.root / "LATEST").read_text())
        except FileNotFoundError:
            return None

    def has(self, version: int, kind: str) -> bool:
        return self.manifest_path(version, kind).is_file()

    def manifest(self, version: int, kind: str) -> WeightManifest:
        path = self.manifest_path(version, kind)
        try:
            return WeightManifest.from_json(path.read_bytes())
        except FileNotFoundError:
            raise SyncError(f"version {version} ({kind}) is not in {self.root}") from None

    def forms(self) -> list[dict]:
        """Every complete form: version, kind, base_version, data_bytes (the puller's plan input).
        A written form never changes, so each manifest is read once."""
        out = []
        for vdir in sorted(self.root.glob("v[0-9]*")):
            for kind in KINDS:
                key = (vdir.name, kind)
                if key not in self._forms and (vdir / kind / "manifest.json").is_file():
                    m = self.manifest(int(vdir.name[1:]), kind)
                    self._forms[key] = {"version": m.version, "kind": kind,
                                        "base_version": m.base_version, "data_bytes": m.data_bytes}
                if key in self._forms and (vdir / kind).is_dir():
                    out.append(self._forms[key])
        return out

    def index(self) -> dict:
        return {"latest": self.latest(), "forms": self.forms()}

    def read_range(self, version: int, kind: str, offset: int, length: int) -> bytes:
        with open(self.data_path(version, kind), "rb") as f:
            f.seek(offset)
            return f.read(length)

    # ---------------------------------------------------------------- garbage

    def collect_garbage(self, keep: int) -> None:
        """Keep the newest ``keep`` versions and the newest anchor at or before the oldest kept
        one (so every kept version stays buildable); delete older version folders."""
        versions = sorted(int(p.name[1:]) for p in self.root.glob("v[0-9]*") if p.name[1:].isdigit())
        if len(versions) <= keep:
            return
        oldest_kept = versions[-keep]
        anchors = [v for v in versions if v <= oldest_kept and self.has(v, "anchor")]
        floor = anchors[-1] if anchors else oldest_kept
        for v in versions:
            if v < floor:
                shutil.rmtree(self.root / f"v{v:08d}", ignore_errors=True)


# ── The publisher ─────────────────────────────────────────────────────────────────────────────────
# The publisher: each new version becomes a delta against the previous one (and an anchor every
# ``anchor_every`` versions, on demand, or when the set of tensors changes), chunked and encoded in
# parallel, written atomically into a VersionStore that an origin server serves.

def chunk_ranges(tensors: list[TensorBits], chunk_elements: int) -> list[tuple[int, int, int]]:
    """(tensor index, start, count) of every chunk, tensors in order, each split evenly."""
    out = []
    for i, t in enumerate(tensors):
        n = t.bits.size
        for start in range(0, n, chunk_elements):
            out.append((i, start, min(chunk_elements, n - start)))
    return out


def encode_form(tensors: list[TensorBits], base: list[TensorBits] | None, cfg: SyncConfig,
                version: int, base_version: int | None, files: list[FileEntry]) -> tuple[WeightManifest, list[bytes]]:
    """Encode every chunk (in parallel) and describe them in a manifest."""
    ranges = chunk_ranges(tensors, cfg.chunk_elements)

    def encode(r: tuple[int, int, int]) -> bytes:
        i, s, n = r
        old = None if base is None else base[i].bits[s:s + n]
        return encode_chunk(tensors[i].bits[s:s + n], old)

    with ThreadPoolExecutor(cfg.threads) as pool:
        payloads = list(pool.map(encode, ranges))
        digests = list(pool.map(lambda t: t.digest(cfg.hash), tensors))
    chunks, offset = [], 0
    for (i, s, n), p in zip(ranges, payloads):
        chunks.append(ChunkEntry(tensor=i, start=s, count=n, offset=offset, length=len(p),
                                 xxh3=xxhash.xxh3_64_hexdigest(p)))
        offset += len(p)
    entries = [TensorEntry(name=t.name, dtype=t.dtype, shape=t.shape, file=t.file, digest=d)
               for t, d in zip(tensors, digests)]
    manifest = WeightManifest(version=version, kind="delta" if base is not None else "anchor",
                              base_version=base_version, hash=cfg.hash, tensors=entries, chunks=chunks,
                              files=files, data_bytes=offset)
    return manifest, payloads


class Publisher:
    def __init__(self, root, cfg: SyncConfig | None = None):
        self.cfg = cfg or SyncConfig()
        self.store = VersionStore(root)
        self.head: list[TensorBits] | None = None
        self.head_version: int | None = self.store.latest()
        if self.head_version is not None:
            self.head = rebuild(self.store, self.head_version, self.cfg.threads)

    def publish(self, tensors: list[TensorBits], files: dict[str, bytes] | None = None,
                version: int | None = None, anchor: bool = False) -> list[WeightManifest]:
        """Publish ``tensors`` as ``version`` (default: the next one); returns the forms written."""
        if version is None:
            version = 0 if self.head_version is None else self.head_version + 1
        if self.head_version is not None and version <= self.head_version:
            raise ValueError(f"version {version} is not newer than the published {self.head_version}")
        entries = [FileEntry(name=name, sha256=self.store.write_blob(data), size=len(data))
                   for name, data in sorted((files or {}).items())]
        delta_ok = self.head is not None and layout(self.head) == layout(tensors)
        written = []
        if delta_ok:
            written.append(encode_form(tensors, self.head, self.cfg, version, self.head_version, entries))
        if not delta_ok or anchor or version % self.cfg.anchor_every == 0:
            written.append(encode_form(tensors, None, self.cfg, version, None, entries))
        for manifest, payloads in written:
            self.store.write_form(manifest, payloads)
        self.store.set_latest(version)
        self.head, self.head_version = tensors, version
        self.store.collect_garbage(self.cfg.keep_versions)
        return [m for m, _ in written]


def rebuild(store: VersionStore, version: int, threads: int = 1) -> list[TensorBits]:
    """A version's tensors from the store's own files (a publisher restarting on an old root)."""
    path, _ = cheapest_path(store.forms(), version, None)
    tensors = None
    for v, kind in path:
        m = store.manifest(v, kind)
        tensors = apply_form(m, lambda i, m=m, v=v, kind=kind: store.read_range(
            v, kind, m.chunks[i].offset, m.chunks[i].length), tensors, threads)
    return tensors


# ── The HTTP origin ───────────────────────────────────────────────────────────────────────────────
# The HTTP face of a VersionStore (the origin; a relay adds fetching on a miss, tidal.sync.relay).
#
# GET /latest                     newest version number (JSON; null if none)
# GET /index                      {"latest", "forms": [{version, kind, base_version, data_bytes}]}
# GET /v/{version}/{kind}/manifest
# GET /v/{version}/{kind}/data    HTTP Range supported (resume, parallel ranges)
# GET /blob/{sha256}              side files (config.json, ...)
# GET /pull?held=H[&version=V][&after=A&wait_s=T][&inline_bytes=N]
#                                 one answer with everything a puller holding H needs to reach
#                                 V (default: the newest): a header, then each form's manifest
#                                 and, when the form's data is at most N bytes, its data. With
#                                 ``after``, waits (long-poll, at most T s) until a version
#                                 newer than A exists: a subscriber learns of a new version
#                                 with no poll round trip; 204 when none came. The answer's format: tidal.sync.client, "The /pull answer".
# GET /stats                      bytes this server has sent (Content-Length of its answers):
#                                 all, and those of manifests and data (version_bytes_sent)

STATS = web.AppKey("stats", dict)
"""``app[STATS]``: {"bytes_sent", "version_bytes_sent", "requests"} of a server made by make_app."""


def make_app(store: VersionStore, relay: Relay | None = None, watch_interval_s: float = 0.002) -> web.Application:
    """Serve ``store``; with a ``relay``, missing forms and blobs are fetched from its upstream
    first and the index is the upstream's (the cache's own when the upstream is down).
    ``watch_interval_s``: how often a waiting subscription looks for a newer version (the
    publisher may be another process, so the store's LATEST file is what is watched)."""
    routes = _Routes(store, relay, watch_interval_s)
    app = web.Application()
    app.on_response_prepare.append(routes.count)
    app.add_routes([web.get("/latest", routes.latest), web.get("/index", routes.index),
                    web.get(r"/v/{version:\d+}/{kind}/manifest", routes.manifest),
                    web.get(r"/v/{version:\d+}/{kind}/data", routes.data),
                    web.get("/blob/{sha}", routes.blob), web.get("/pull", routes.pull),
                    web.get("/stats", routes.stats_route)])
    app[STATS] = routes.stats
    if relay is not None:
        app.on_cleanup.append(lambda _app: relay.close())
    return app


class _Routes:
    """The route handlers of one server (see the module docstring for what each answers) and
    the byte counts of its answers (``stats``)."""

    def __init__(self, store: VersionStore, relay: Relay | None, watch_interval_s: float):
        self.store, self.relay, self.watch_interval_s = store, relay, watch_interval_s
        self.stats = {"bytes_sent": 0, "version_bytes_sent": 0, "requests": 0}

    async def current_index(self) -> dict:
        return self.store.index() if self.relay is None else await self.relay.index()

    async def current_latest(self) -> int | None:
        return self.store.latest() if self.relay is None else (await self.relay.index())["latest"]

    async def present(self, request: web.Request) -> tuple[int, str]:
        """The request's (version, kind), held here (a relay fetches it first); else 404/502."""
        version, kind = int(request.match_info["version"]), request.match_info["kind"]
        if kind not in KINDS:
            raise web.HTTPNotFound(text=f"kind must be one of {KINDS}")
        if self.relay is not None:
            try:
                await self.relay.ensure(version, kind)
            except SyncError as e:
                raise web.HTTPBadGateway(text=str(e)) from None
        if not self.store.has(version, kind):
            raise web.HTTPNotFound(text=f"version {version} has no {kind} here")
        return version, kind

    async def latest(self, request):
        return web.json_response(await self.current_latest())

    async def index(self, request):
        return web.json_response(await self.current_index())

    async def manifest(self, request):
        version, kind = await self.present(request)
        return web.FileResponse(self.store.manifest_path(version, kind))

    async def data(self, request):
        version, kind = await self.present(request)
        return web.FileResponse(self.store.data_path(version, kind))

    async def blob(self, request):
        try:
            path = self.store.blob_path(request.match_info["sha"])
        except SyncError as e:
            raise web.HTTPBadRequest(text=str(e)) from None
        if self.relay is not None and not path.exists():
            try:
                await self.relay.ensure_blob(request.match_info["sha"])
            except SyncError as e:
                raise web.HTTPBadGateway(text=str(e)) from None
        if not path.exists():
            raise web.HTTPNotFound(text="no such blob")
        return web.FileResponse(path)

    async def pull(self, request):
        held, after, wait_s, inline_bytes, wanted = _pull_query(request.query)
        if after is not None and not await self._newer_than(after, wait_s):
            return web.Response(status=204)
        index = await self.current_index()
        target = index["latest"] if wanted is None else wanted
        if target is None:
            raise web.HTTPNotFound(text="no version has been published yet")
        try:
            path, _ = cheapest_path(index["forms"], target, held)
            if self.relay is not None:
                for v, kind in path:
                    await self.relay.ensure(v, kind)
            parts = await asyncio.to_thread(bundle_parts, self.store, target, path, inline_bytes)
        except SyncError as e:
            raise web.HTTPConflict(text=str(e)) from None
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        resp.content_length = sum(len(p) for p in parts)
        await resp.prepare(request)
        for p in parts:
            await resp.write(p)
        await resp.write_eof()
        return resp

    async def _newer_than(self, after: int, wait_s: float) -> bool:
        """Wait (at most ``wait_s``) until a version newer than ``after`` exists; False if none
        came in time."""
        deadline = asyncio.get_running_loop().time() + wait_s
        while ((latest := await self.current_latest()) is None or latest <= after):
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(self.watch_interval_s)
        return True

    async def stats_route(self, request):
        return web.json_response(self.stats)

    async def count(self, request, response):
        if request.path != "/stats":
            self.stats["requests"] += 1
            self.stats["bytes_sent"] += response.content_length or 0
            if request.path.startswith("/v/") or request.path == "/pull":
                self.stats["version_bytes_sent"] += response.content_length or 0


def _pull_query(q) -> tuple[int | None, int | None, float, int, int | None]:
    """/pull's query -> (held, after, wait_s, inline_bytes, version); 400 if malformed."""
    try:
        held = int(q["held"]) if q.get("held") not in (None, "") else None
        after = int(q["after"]) if "after" in q else None
        wait_s = min(float(q.get("wait_s", 0)), 600.0)
        inline_bytes = int(q.get("inline_bytes", 64 << 20))
        wanted = int(q["version"]) if "version" in q else None
    except ValueError as e:
        raise web.HTTPBadRequest(text=f"bad query: {e}") from None
    return held, after, wait_s, inline_bytes, wanted


class ServerThread:
    """Serve an app from a background thread with its own event loop (the driver's origin,
    tests). ``port=0`` picks a free port; ``url`` says where it listens."""

    def __init__(self, app: web.Application, host: str = "127.0.0.1", port: int = 0):
        self.app, self.host = app, host
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(port,), daemon=True, name="tidal-sync-server")
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _run(self, port: int) -> None:
        asyncio.set_event_loop(self.loop)
        self._error = None
        self.runner = web.AppRunner(self.app, access_log=None)
        try:
            self.loop.run_until_complete(self.runner.setup())
            site = web.TCPSite(self.runner, self.host, port)
            self.loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]
        except OSError as e:
            self._error = SyncError(f"cannot listen on {self.host}:{port}: {e}")
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


def serve_forever(app: web.Application, host: str, port: int) -> None:
    """Blocking serve for `tidal sync serve` and `tidal sync relay` (Ctrl-C stops)."""
    web.run_app(app, host=host, port=port, access_log=None, print=lambda *_: None)


# ── The /pull answer, written ─────────────────────────────────────────────────────────────────────
# Its format and its reader: tidal.sync.client, "The /pull answer".

def bundle_parts(store: VersionStore, target: int, path: list[tuple[int, str]], inline_bytes: int) -> list[bytes]:
    """The answer's byte strings (server side; blocking file reads, run in a thread)."""
    forms, body = [], []
    for v, kind in path:
        manifest = store.manifest_path(v, kind).read_bytes()
        data_bytes = store.data_path(v, kind).stat().st_size
        inline = data_bytes <= inline_bytes
        forms.append({"version": v, "kind": kind, "manifest_bytes": len(manifest),
                      "data_bytes": data_bytes, "inline": inline})
        body.append(manifest)
        if inline:
            body.append(store.data_path(v, kind).read_bytes())
    header = json.dumps({"version": target, "forms": forms}).encode()
    return [HEADER_LENGTH.pack(len(header)), header, *body]
