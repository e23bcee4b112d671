"""The HTTP face of a VersionStore (the origin; a relay adds fetching on a miss, relay.py).

    GET /latest                     newest version number (JSON; null if none)
    GET /index                      {"latest", "forms": [{version, kind, base_version, data_bytes}]}
    GET /v/{version}/{kind}/manifest
    GET /v/{version}/{kind}/data    HTTP Range supported (resume, parallel ranges)
    GET /blob/{sha256}              side files (config.json, ...)
    GET /pull?held=H[&version=V][&after=A&wait_s=T][&inline_bytes=N]
                                    one answer with everything a puller holding H needs to reach
                                    V (default: the newest): a header, then each form's manifest
                                    and, when the form's data is at most N bytes, its data. With
                                    ``after``, waits (long-poll, at most T s) until a version
                                    newer than A exists: a subscriber learns of a new version
                                    with no poll round trip; 204 when none came. See bundle.py.
    GET /stats                      bytes this server has sent (Content-Length of its answers):
                                    all, and those of manifests and data (version_bytes_sent)
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING

from aiohttp import web

from tidal.sync.bundle import bundle_parts
from tidal.sync.errors import SyncError
from tidal.sync.plan import cheapest_path
from tidal.sync.store import KINDS, VersionStore

if TYPE_CHECKING:
    from tidal.sync.relay import Relay

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
