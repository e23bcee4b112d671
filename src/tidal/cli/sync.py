"""`tidal sync publish | serve | relay | pull`: any process can take part in weight sync.

    tidal sync publish CHECKPOINT_DIR --root ROOT      next version (delta, or anchor as configured);
                                                       --dtype keep: each tensor as stored
    tidal sync serve --root ROOT --port PORT           origin
    tidal sync relay --upstream URL --port PORT --cache DIR
    tidal sync pull --upstream URL --out DIR [--version V]

Settings come from the ``[sync]`` section (``--config TOML``, dotted overrides like
``--sync.anchor_every 5``). Failures a user can fix exit 2 with one line saying what to fix.
"""

from __future__ import annotations

from pathlib import Path


def _cfg(args, rest):
    from tidal.config import load_config

    return load_config(args.config, rest).sync


def _dtype(flag: str | None, cfg) -> str:
    """--dtype (checked and "auto" resolved like sync.serving_dtype), else sync.serving_dtype."""
    from tidal.hardware import resolve_dtype
    from tidal.sync.errors import SyncError
    from tidal.sync.tensors import check_dtype_name

    if flag is None:
        return cfg.serving_dtype
    try:
        return resolve_dtype(check_dtype_name(flag, ("auto", "keep")))
    except ValueError as e:
        raise SyncError(f"--dtype: {e}") from None


def cmd_publish(args, rest) -> int:
    from tidal.sync.errors import SyncError
    from tidal.sync.origin import Publisher
    from tidal.sync.tensors import read_safetensors_folder, serving_bits

    cfg = _cfg(args, rest)
    folder = Path(args.checkpoint)
    if not folder.is_dir() or not list(folder.glob("*.safetensors")):
        raise SyncError(f"{folder} holds no *.safetensors files: name a checkpoint folder")
    tensors = serving_bits(read_safetensors_folder(folder), _dtype(args.dtype, cfg), cfg.dtype_rules)
    files = {p.name: p.read_bytes() for p in sorted(folder.iterdir())
             if p.is_file() and p.suffix != ".safetensors" and p.stat().st_size <= args.max_side_file_bytes}
    forms = Publisher(args.root, cfg).publish(tensors, files, version=args.version, anchor=args.anchor)
    for m in forms:
        print(f"published version {m.version} ({m.kind}{'' if m.base_version is None else f' on {m.base_version}'}): "
              f"{m.data_bytes} bytes in {len(m.chunks)} chunks")
    return 0


def cmd_serve(args, rest) -> int:
    from tidal.sync.origin import VersionStore, make_app, serve_forever

    _cfg(args, rest)
    print(f"serving {args.root} on http://{args.host}:{args.port}", flush=True)
    serve_forever(make_app(VersionStore(args.root)), args.host, args.port)
    return 0


def cmd_relay(args, rest) -> int:
    from tidal.sync.origin import make_app, serve_forever
    from tidal.sync.relay import Relay

    relay = Relay(args.upstream, args.cache, _cfg(args, rest))
    print(f"relaying {', '.join(args.upstream)} on http://{args.host}:{args.port}", flush=True)
    serve_forever(make_app(relay.store, relay), args.host, args.port)
    return 0


def cmd_pull(args, rest) -> int:
    from tidal.sync.pull import Puller, pull_to_folder

    puller = Puller(args.upstream, _cfg(args, rest))
    folder = pull_to_folder(puller, Path(args.out), args.version)
    print(f"version {puller.version} written to {folder} ({puller.bytes_fetched} bytes fetched)")
    return 0


def add_parsers(sub) -> None:
    s = sub.add_parser("sync", help="weight sync: publish, serve, relay and pull versions")
    ss = s.add_subparsers(dest="sync_command", required=True)

    def common(p):
        p.add_argument("--config", help="TOML file whose [sync] section sets the defaults")

    p = ss.add_parser("publish", help="add a checkpoint's safetensors as the next version")
    p.add_argument("checkpoint", help="folder with *.safetensors (and config.json etc.)")
    p.add_argument("--root", required=True, help="the origin's version folder")
    p.add_argument("--version", type=int, help="version number (default: the next one)")
    p.add_argument("--anchor", action="store_true", help="also publish a full snapshot now")
    p.add_argument("--dtype", help='serving dtype, or "keep" = each tensor as stored (default: '
                                   "sync.serving_dtype; sync.dtype_rules still apply per tensor)")
    p.add_argument("--max-side-file-bytes", type=int, default=64 << 20,
                   help="other files up to this size (config.json, tokenizer) travel along")
    common(p)
    p.set_defaults(fn=cmd_publish)

    p = ss.add_parser("serve", help="serve a version folder over HTTP (the origin)")
    p.add_argument("--root", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for all)")
    common(p)
    p.set_defaults(fn=cmd_serve)

    p = ss.add_parser("relay", help="serve a region from a cache filled from an upstream")
    p.add_argument("--upstream", action="append", required=True, help="origin or relay URL (repeat for fallbacks)")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--cache", required=True, help="folder for the last K versions")
    p.add_argument("--host", default="127.0.0.1")
    common(p)
    p.set_defaults(fn=cmd_relay)

    p = ss.add_parser("pull", help="fetch a version and write it as safetensors")
    p.add_argument("--upstream", action="append", required=True, help="relay or origin URL (repeat for fallbacks)")
    p.add_argument("--out", required=True, help="folder for version folders and LATEST")
    p.add_argument("--version", type=int, help="version to fetch (default: the newest)")
    common(p)
    p.set_defaults(fn=cmd_pull)
