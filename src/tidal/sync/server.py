"""The HTTP face of a VersionStore (the origin; a relay adds fetching on a miss, relay.py).

    GET /latest                     newest version number (JSON; null if none)
    GET /index                      {"latest", "forms": [{version, kind, base_version, data_bytes}]}
    GET /v/{version}/{kind}/manifest
    GET /v/{version}/{kind}/data    HTTP Range supported (resume, parallel ranges)
    GET /blob/{sha256}              side files (config.json, ...)
    GET /stats                      bytes this server has sent (Content-Length of its answers):
                                    all, and those of manifests and data (version_bytes_sent)
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING

from aiohttp import web

from tidal.sync.errors import SyncError
from tidal.sync.store import KINDS, VersionStore

if TYPE_CHECKING:
    from tidal.sync.relay import Relay

STATS = web.AppKey("stats", dict)
"""``app[STATS]``: {"bytes_sent", "version_bytes_sent", "requests"} of a server made by make_app."""


def make_app(store: VersionStore, relay: "Relay | None" = None) -> web.Application:
    """Serve ``store``; with a ``relay``, missing forms and blobs are fetched from its upstream
    first and the index is the upstream's (the cache's own when the upstream is down)."""
    stats = {"bytes_sent": 0, "version_bytes_sent": 0, "requests": 0}

    async def current_index() -> dict:
        return store.index() if relay is None else await relay.index()

    async def present(request: web.Request) -> tuple[int, str]:
        version, kind = int(request.match_info["version"]), request.match_info["kind"]
        if kind not in KINDS:
            raise web.HTTPNotFound(text=f"kind must be one of {KINDS}")
        if relay is not None:
            try:
                await relay.ensure(version, kind)
            except SyncError as e:
                raise web.HTTPBadGateway(text=str(e)) from None
        if not store.has(version, kind):
            raise web.HTTPNotFound(text=f"version {version} has no {kind} here")
        return version, kind

    async def latest(request):
        return web.json_response(store.latest() if relay is None else (await relay.index())["latest"])

    async def index_route(request):
        return web.json_response(await current_index())

    async def manifest(request):
        version, kind = await present(request)
        return web.FileResponse(store.manifest_path(version, kind))

    async def data(request):
        version, kind = await present(request)
        return web.FileResponse(store.data_path(version, kind))

    async def blob(request):
        try:
            path = store.blob_path(request.match_info["sha"])
        except SyncError as e:
            raise web.HTTPBadRequest(text=str(e)) from None
        if relay is not None and not path.exists():
            try:
                await relay.ensure_blob(request.match_info["sha"])
            except SyncError as e:
                raise web.HTTPBadGateway(text=str(e)) from None
        if not path.exists():
            raise web.HTTPNotFound(text="no such blob")
        return web.FileResponse(path)

    async def stats_route(request):
        return web.json_response(stats)

    async def count(request, response):
        if request.path != "/stats":
            stats["requests"] += 1
            stats["bytes_sent"] += response.content_length or 0
            if request.path.startswith("/v/"):
                stats["version_bytes_sent"] += response.content_length or 0

    app = web.Application()
    app.on_response_prepare.append(count)
    app.add_routes([web.get("/latest", latest), web.get("/index", index_route),
                    web.get(r"/v/{version:\d+}/{kind}/manifest", manifest),
                    web.get(r"/v/{version:\d+}/{kind}/data", data),
                    web.get("/blob/{sha}", blob), web.get("/stats", stats_route)])
    app[STATS] = stats
    if relay is not None:
        app.on_cleanup.append(lambda _app: relay.close())
    return app


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
