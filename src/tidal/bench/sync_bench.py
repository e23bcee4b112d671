"""`tidal bench sync --json PATH`: weight sync against its peers, side by side in one run.

    a. codec on the standard workload (107M-param Qwen3-style model, bf16 serving weights of fp32
       masters, AdamW lr 1e-6 on its own next-token loss) and on a short RL run's real steps:
       tidal vs the full snapshot, vs XOR+zstd-1, vs the order-0 entropy bound; MB/s per core
    b. one update over an emulated WAN (netns + veth, tbf 1 Gbit/s, +50 ms RTT proxy): tidal vs
       the full snapshot over HTTP vs rsync of the safetensors file (root, rsync, iproute2)
    c. fan-out on loopback: 1 origin, 2 relays, 4 pullers; bytes the origin sent per update byte
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from tidal.bench.common import write_json
from tidal.bench.sync_codec import adamw_snapshots, measure_step, median_of, rl_snapshots

COLUMNS = ("changed_fraction", "bytes", "ratio_vs_full", "ratio_vs_xor_zstd", "ratio_vs_entropy_bound",
           "encode_mb_s_per_core", "decode_mb_s_per_core")
TARGETS = {"ratio_vs_entropy_bound": "<= 1.15", "ratio_vs_xor_zstd": ">= 1.5", "encode_mb_s_per_core": ">= 500",
           "decode_mb_s_per_core": ">= 1000", "wan_speedup_vs_rsync": ">= 20", "wan_speedup_vs_full": ">= 40",
           "full_link_utilisation": ">= 0.9", "origin_bytes_per_update_byte": "<= 2"}


def add_arguments(p) -> None:
    p.add_argument("--json", required=True, help="where to write the results")
    p.add_argument("--steps", type=int, default=10, help="AdamW steps of workload a")
    p.add_argument("--seq-len", type=int, default=16, help="tokens per sequence of workload a's loss")
    p.add_argument("--batch", type=int, default=2, help="sequences per step of workload a")
    p.add_argument("--rl-steps", type=int, default=4, help="RL trainer steps of workload b (0 = skip)")
    p.add_argument("--no-wan", action="store_true", help="skip the emulated wide-area link")
    p.add_argument("--threads", type=int, default=2, help="encode/decode threads")
    p.add_argument("--chunk-elements", type=int, default=1 << 22)
    p.add_argument("--workdir", help="scratch folder (default: a temporary one, removed after)")


def print_rows(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print("step " + " ".join(f"{c:>22}" for c in COLUMNS))
    for i, r in enumerate(rows, 1):
        print(f"{i:>4} " + " ".join(f"{r[c]:>22.4g}" for c in COLUMNS))


def codec_rows(snapshots, args) -> tuple[list[dict], tuple]:
    rows, prev, last_pair = [], None, None
    for snap in snapshots:
        if prev is not None:
            rows.append(measure_step(prev, snap, args.chunk_elements, args.threads))
            last_pair = (prev, snap)
        prev = snap
    return rows, last_pair


def fan_out(prev, cur, work: Path, threads: int) -> dict:
    """Origin, two relays, four pullers on loopback; origin's version bytes per update byte."""
    from tidal.sync.config import SyncConfig
    from tidal.sync.publisher import Publisher
    from tidal.sync.puller import Puller
    from tidal.sync.relay import Relay
    from tidal.sync.server import STATS, ServerThread, make_app

    cfg = SyncConfig(threads=threads)
    pub = Publisher(work / "fan-origin", cfg)
    pub.publish(prev, version=0)
    servers = [ServerThread(make_app(pub.store))]
    try:
        for r in range(2):
            relay = Relay([servers[0].url], work / f"fan-relay{r}", cfg)
            servers.append(ServerThread(make_app(relay.store, relay)))
        pullers = [Puller([servers[1 + i % 2].url], cfg) for i in range(4)]
        for p in pullers:
            p.pull(0)
        (manifest,) = pub.publish(cur, version=1)
        sent = servers[0].app[STATS]["version_bytes_sent"]
        for p in pullers:
            p.pull(1)
        update_bytes = manifest.data_bytes + len(manifest.to_json())
        return {"origin_bytes_per_update_byte": (servers[0].app[STATS]["version_bytes_sent"] - sent) / update_bytes,
                "update_bytes": update_bytes}
    finally:
        for s in servers:
            s.stop()


def wan(prev, cur, work: Path) -> dict:
    from tidal.bench.sync_wan import missing_tools, run_wan
    from tidal.sync.publisher import Publisher
    from tidal.sync.tensors import write_safetensors_files

    why = missing_tools()
    if why:
        print(f"\nWAN part skipped: {why}")
        return {"wan_skipped": why}
    pub = Publisher(work / "wan-origin")
    pub.publish(prev, version=0)
    pub.publish(cur, version=1)
    for folder, snap in ((work / "wan-files", cur), (work / "wan-rsync-base", prev)):
        folder.mkdir()
        write_safetensors_files(snap, folder)
    return run_wan(work / "wan-origin", work / "wan-files", work / "wan-rsync-base", 0, 1)


def run_from_args(args) -> int:
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tidal-bench-sync-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        rows_a, (prev, cur) = codec_rows(adamw_snapshots(args.steps, args.seq_len, args.batch), args)
        print_rows("a. codec, standard workload (107M params, AdamW lr 1e-6, bf16 serving)", rows_a)
        result = {c: median_of(rows_a, c) for c in COLUMNS if c != "bytes"}
        result["steps_a"] = rows_a
        if args.rl_steps:
            rows_b, _ = codec_rows(rl_snapshots(work / "rl-run", args.rl_steps), args)
            print_rows("a. codec, trainer's real steps of a short RL run (default recipe, bf16 serving)", rows_b)
            result["steps_rl"] = rows_b
        result.update(fan_out(prev, cur, work, args.threads))
        if not args.no_wan:
            result.update(wan(prev, cur, work))
        print("\nmedians of workload a, transfer and fan-out (anchors: ~50x Fireworks, ~79x PULSE vs full)")
        for key, value in result.items():
            if isinstance(value, (int, float)):
                print(f"  {key:<32} {value:>12.4g}   {TARGETS.get(key, '')}")
        write_json(args.json, result)
        print(f"\nwrote {args.json}")
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return 0
