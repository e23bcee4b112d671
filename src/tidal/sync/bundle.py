"""One HTTP answer that carries a whole pull (``GET /pull``): no index, manifest and data round
trips one after the other, so a small update costs one request (or none, for a subscriber whose
long-poll was already waiting when the version appeared).

    u32 little-endian header length | header JSON {"version": V, "forms": [{"version", "kind",
    "manifest_bytes", "data_bytes", "inline"}]} | per form: manifest JSON, then (if inline) its
    data file (the chunk payloads back to back, as the manifest lists them)

Chunks are checked against their xxh3 as they arrive, exactly as range fetches are; whatever the
answer did not carry (a big form, a stream that broke off or failed a check) the puller fetches
by ranges afterwards.
"""

from __future__ import annotations

import asyncio
import json
import struct
import time
from collections.abc import Callable

from tidal.sync.client import NETWORK_ERRORS, ChunkFeed, read_verified
from tidal.sync.errors import VerificationError
from tidal.sync.manifest import WeightManifest
from tidal.sync.store import VersionStore

HEADER_LENGTH = struct.Struct("<I")


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


async def read_bundle(content: asyncio.StreamReader, received: list[int], timeline: dict | None = None,
                      on_first_form: Callable[[tuple, WeightManifest, ChunkFeed], None] | None = None):
    """(target version, [(form step, manifest or None, ChunkFeed {chunk key: payload})]) from a
    /pull answer. Stops at the first broken or failing chunk; what was read and verified is kept.
    ``on_first_form(step, manifest, feed)`` is called when the first form's manifest has arrived
    and its data is about to (the puller starts applying it chunk by chunk)."""
    (n,) = HEADER_LENGTH.unpack(await content.readexactly(HEADER_LENGTH.size))
    if timeline is not None:
        timeline.setdefault("first_byte", time.time())
    header = json.loads(await content.readexactly(n))
    out = []
    broken = False
    for f in header["forms"]:
        step, have = (f["version"], f["kind"]), ChunkFeed()
        out.append((step, None, have))
        if broken:
            continue
        try:
            manifest = WeightManifest.from_json(await content.readexactly(f["manifest_bytes"]))
            out[-1] = (step, manifest, have)
            if f["inline"]:
                if on_first_form is not None and len(out) == 1:
                    on_first_form(step, manifest, have)
                await read_verified(content, enumerate(manifest.chunks), have, received, "a /pull answer")
        except (*NETWORK_ERRORS, VerificationError, ValueError):
            broken = True
    if timeline is not None:
        timeline["last_byte"] = time.time()
    return header["version"], out
