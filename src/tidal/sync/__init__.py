"""Weight sync between regions: delta-compressed, bit-exact, resumable, relayed.

    trainer step ──> Publisher (cast to serving dtype; delta vs previous, anchor every N;
                     chunks encoded in parallel; manifest with per-chunk xxh3 + per-tensor BLAKE3)
                 ──> VersionStore on disk ──> origin (aiohttp, HTTP Range)
                 ──> relays (cache last K versions; chainable) ──> Pullers (one per pool:
                     cheapest path, parallel ranges, verify, resume, apply, BLAKE3 check)
                 ──> Engine.load_weights between decode steps

See docs/sync.md for the wire format, the codec and the failure handling.

Modules import their dependencies (aiohttp, constriction, torch) themselves; this package
imports nothing, so reading the ``[sync]`` config section stays cheap.
"""
