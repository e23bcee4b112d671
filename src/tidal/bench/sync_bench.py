"""`tidal bench sync --json PATH`: weight sync against its peers, side by side in one run.

    tidal bench sync --json s.json --bench.rl_steps 0 --bench.wan false   # codec and fan-out only
    tidal bench sync --json s.json --sync.threads 1 --sync.chunk_elements 1048576

    a. codec on the standard workload (107M-param Qwen3-style model, bf16 serving weights of fp32
       masters, AdamW lr 1e-6 on its own next-token loss) and on a short RL run's real steps:
       tidal vs the full snapshot, vs XOR+zstd-1, vs the order-0 entropy bound; MB/s per core;
       beside it the same steps as an fp8 checkpoint (e4m3fn linear weights re-quantised from the
       fp32 masters each step, per-block or per-tensor fp32 scales, the rest bf16): "codec.fp8.*"
    b. one update over an emulated WAN (netns + veth, tbf 1 Gbit/s, +50 ms RTT proxy): tidal vs
       the full snapshot over HTTP vs rsync of the safetensors file (root, rsync, iproute2);
       beside it the receiver's constants on this machine ("receiver": decode+apply, BLAKE3 and
       sha256 per core, and the in-process receive rate) and what
       tidal.sync.pull.predict_delivery_s makes of them for this link ("predicted_tidal_s")
    c. fan-out on loopback: 1 origin, 2 relays, 4 pullers; bytes the origin sent per update byte

Encode/decode threads and the chunk size are the run config's ``sync.threads`` and
``sync.chunk_elements``; the publishers, relays and pullers run the run config's ``[sync]``.
Workload b is the default recipe's short RL run (sync_codec.rl_snapshots), whatever the recipe.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from pydantic import Field

from tidal.bench.common import write_json
from tidal.bench.config import config_record, main
from tidal.bench.sync_codec import (
    adamw_models,
    fp8_snapshot,
    measure_step,
    median_of,
    receiver_throughput,
    rl_snapshots,
    serving_snapshot,
)
from tidal.config import ConfigError, TidalConfig
from tidal.config_section import Section
from tidal.sync.config import SyncConfig

COLUMNS = ("changed_fraction", "bytes", "ratio_vs_full", "ratio_vs_xor_zstd", "ratio_vs_entropy_bound",
           "encode_mb_s_per_core", "decode_mb_s_per_core")
TARGETS = {"ratio_vs_entropy_bound": "<= 1.15", "ratio_vs_xor_zstd": ">= 1.5", "encode_mb_s_per_core": ">= 500",
           "decode_mb_s_per_core": ">= 1000", "wan_speedup_vs_rsync": ">= 20", "wan_speedup_vs_full": ">= 40",
           "full_link_utilisation": ">= 0.9", "origin_bytes_per_update_byte": "<= 2"}


READS = ("sync",)
"""What of the run config this benchmark uses (recorded in its JSON under "config")."""


class BenchSection(Section):
    """Encode/decode threads and chunk size: sync.threads and sync.chunk_elements; the fan-out's
    origin, relays and pullers and the WAN origin run the run config's [sync]. --json is required."""

    steps: int = Field(10, ge=1)
    """AdamW steps of workload a (one codec row each)."""
    seq_len: int = Field(16, ge=1)
    """Tokens per sequence of workload a's next-token loss."""
    batch: int = Field(2, ge=1)
    """Sequences per AdamW step of workload a."""
    fp8_block: int = Field(128, ge=0, le=4096)
    """Side, in elements, of the square tile that shares one scale in workload a's fp8 rows
    (128 = DeepSeek-V3's block scales); 0 = one scale per tensor."""
    rl_steps: int = Field(4, ge=0)
    """RL trainer steps of workload b (the default recipe's short RL run); 0 = skip it."""
    wan: bool = True
    """Run part b, one update over the emulated wide-area link (needs root, rsync, iproute2;
    skipped with the reason when they are missing)."""
    workdir: str = ""
    """Scratch folder, kept afterwards; "" = a temporary one, removed after."""


def print_rows(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print("step " + " ".join(f"{c:>22}" for c in COLUMNS))
    for i, r in enumerate(rows, 1):
        print(f"{i:>4} " + " ".join(f"{r[c]:>22.4g}" for c in COLUMNS))


def workload_a(bench: BenchSection, sync: SyncConfig) -> tuple[list[dict], list[dict], tuple]:
    """(bf16 rows, fp8 rows, the last bf16 (previous, current) pair): one AdamW run, each step
    served both ways from the same fp32 masters."""
    rows, fp8_rows, prev, last_pair = [], [], None, None
    for model in adamw_models(bench.steps, bench.seq_len, bench.batch):
        cur = (serving_snapshot(model), fp8_snapshot(model, bench.fp8_block))
        if prev is not None:
            rows.append(measure_step(prev[0], cur[0], sync.chunk_elements, sync.threads))
            fp8_rows.append(measure_step(prev[1], cur[1], sync.chunk_elements, sync.threads))
            last_pair = (prev[0], cur[0])
        prev = cur
    return rows, fp8_rows, last_pair


def codec_rows(snapshots, sync: SyncConfig) -> tuple[list[dict], tuple]:
    rows, prev, last_pair = [], None, None
    for snap in snapshots:
        if prev is not None:
            rows.append(measure_step(prev, snap, sync.chunk_elements, sync.threads))
            last_pair = (prev, snap)
        prev = snap
    return rows, last_pair


FP8_KEYS = COLUMNS + ("full_bytes",)
"""Per-step figures whose medians the fp8 and bf16 rows report as "codec.{fp8,bf16}.*"; MB/s are
each form's own model bytes (fp8 checkpoint ~0.6x bf16's) per CPU second."""


def fp8_record(rows_bf16: list[dict], rows_fp8: list[dict], block: int) -> dict:
    """Workload a's fp8 medians as "codec.fp8.*" beside "codec.bf16.*" (the same steps), the
    fp8 update's bytes per bf16 update byte, and its bytes per dtype ("codec.fp8.bytes.float32":
    the scales)."""
    out = {"codec.fp8.scale_block": block, "steps_fp8": rows_fp8}
    for name, rows in (("bf16", rows_bf16), ("fp8", rows_fp8)):
        out.update({f"codec.{name}.{k}": median_of(rows, k) for k in FP8_KEYS})
    out["codec.fp8.bytes_per_bf16_byte"] = out["codec.fp8.bytes"] / out["codec.bf16.bytes"]
    for dtype in rows_fp8[0].get("bytes_by_dtype", {}):  # where the fp8 update's bytes go
        out[f"codec.fp8.bytes.{dtype}"] = float(np.median([r["bytes_by_dtype"][dtype] for r in rows_fp8]))
    return out


LINK = {"bandwidth_bps": 1e9, "latency_s": 0.025, "overhead_s": 0.002}
"""Part b's emulated link (tbf rate, the proxy's one-way delay) and the origin's LATEST watch."""


def receiver_record(rows: list[dict], prev, cur, sync: SyncConfig) -> dict:
    """The receiving side's constants on this machine, for a simulator: per-core medians of
    workload a's steps, and the last step applied as a puller applies it."""
    record = {key: median_of(rows, key) for key in
              ("decode_mb_s_per_core", "blake3_mb_s_per_core", "sha256_mb_s_per_core")}
    record.update(receiver_throughput(prev, cur, sync))
    return record


def predicted(receiver: dict) -> float:
    """predict_delivery_s for part b's update and link with this machine's receive rate."""
    from tidal.sync.pull import predict_delivery_s

    return predict_delivery_s(receiver["delta_bytes"], receiver["full_bytes"], LINK["bandwidth_bps"],
                              LINK["latency_s"], receiver["receive_model_bytes_per_s"], 1,
                              overhead_s=LINK["overhead_s"])


def fan_out(prev, cur, work: Path, cfg: SyncConfig) -> dict:
    """Origin, two relays, four pullers on loopback; origin's version bytes per update byte."""
    from tidal.sync.origin import STATS, Publisher, ServerThread, make_app
    from tidal.sync.pull import Puller
    from tidal.sync.relay import Relay

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


def wan(prev, cur, work: Path, cfg: SyncConfig) -> dict:
    from tidal.bench.sync_wan import missing_tools, run_wan
    from tidal.sync.origin import Publisher
    from tidal.sync.tensors import write_safetensors_files

    why = missing_tools()
    if why:
        print(f"\nWAN part skipped: {why}")
        return {"wan_skipped": why}
    pub = Publisher(work / "wan-origin", cfg)
    pub.publish(prev, version=0)
    pub.publish(cur, version=1)
    for folder, snap in ((work / "wan-files", cur), (work / "wan-rsync-base", prev)):
        folder.mkdir()
        write_safetensors_files(snap, folder)
    return run_wan(work / "wan-origin", work / "wan-files", work / "wan-rsync-base", 0, 1)


def run(bench: BenchSection, cfg: TidalConfig, json_path: str | None) -> int:
    if not json_path:
        raise ConfigError("tidal bench sync needs --json PATH: where to write the results")
    work = Path(bench.workdir or tempfile.mkdtemp(prefix="tidal-bench-sync-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        result = measure(bench, cfg.sync, work)
        result["config"] = config_record(bench, cfg, READS)
        write_json(json_path, result)
        print(f"\nwrote {json_path}")
    finally:
        if not bench.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def measure(bench: BenchSection, sync: SyncConfig, work: Path) -> dict:
    """Parts a, b and c in ``work``; prints their tables; returns the result."""
    rows_a, rows_fp8, (prev, cur) = workload_a(bench, sync)
    print_rows("a. codec, standard workload (107M params, AdamW lr 1e-6, bf16 serving)", rows_a)
    scale = f"block {bench.fp8_block}" if bench.fp8_block else "per tensor"
    print_rows(f"a. codec, the same steps as fp8 (e4m3fn weights re-quantised, {scale} fp32 scales)", rows_fp8)
    result = {c: median_of(rows_a, c) for c in COLUMNS if c != "bytes"}
    result["steps_a"] = rows_a
    result.update(fp8_record(rows_a, rows_fp8, bench.fp8_block))
    if bench.rl_steps:
        rows_b, _ = codec_rows(rl_snapshots(work / "rl-run", bench.rl_steps), sync)
        print_rows("a. codec, trainer's real steps of a short RL run (default recipe, bf16 serving)", rows_b)
        result["steps_rl"] = rows_b
    result.update(fan_out(prev, cur, work, sync))
    result["receiver"] = receiver_record(rows_a, prev, cur, sync)
    if bench.wan:
        result.update(wan(prev, cur, work, sync))
        if "tidal_s" in result:
            result["predicted_tidal_s"] = predicted(result["receiver"])
    print("\nmedians of workload a, transfer and fan-out (anchors: ~50x Fireworks, ~79x PULSE vs full)")
    for key, value in result.items():
        if isinstance(value, (int, float)):
            print(f"  {key:<32} {value:>12.4g}   {TARGETS.get(key, '')}")
    return result


if __name__ == "__main__":
    raise SystemExit(main(sys.modules[__name__], "sync"))
