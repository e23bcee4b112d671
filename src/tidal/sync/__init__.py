"""Weight sync between regions: delta-compressed, bit-exact, resumable, relayed.

    trainer step ──> Publisher (cast to serving dtype; delta vs previous, anchor every N;
                     chunks encoded in parallel; manifest with per-chunk xxh3 + per-tensor BLAKE3)
                 ──> VersionStore on disk ──> origin (aiohttp, HTTP Range)
                 ──> relays (cache last K versions; chainable) ──> Pullers (one per pool:
                     cheapest path, parallel ranges, verify, resume, apply, BLAKE3 check)
                 ──> Engine.load_weights between decode steps

The modules, each importing only those above it:

    errors     SyncError, VerificationError (a user can cause and fix them)
    tensors    tensors as bit patterns; the dtype each is published in (sync.dtype_rules)
    config     the [sync] section (SyncConfig)
    codec      the chunk codec: five lossless kinds, Rice and rANS coders, the entropy bound
    manifest   WeightManifest (what describes a version's form) and the cheapest pull path
    client     chunks fetched and verified over HTTP, the /pull answer, a form applied and hashed
    origin     VersionStore, Publisher and the HTTP origin serving them
    relay      a region's caching relay in front of an origin or another relay
    pull       Puller, versions kept as folders, the delivery-time model
    transport  the WeightPublisher / WeightSource Protocols of `tidal train`, filesystem and HTTP

See docs/sync.md for the wire format, the codec and the failure handling.

Modules import their dependencies (aiohttp, constriction, torch) themselves; this package
imports nothing, so reading the ``[sync]`` config section stays cheap.
"""
