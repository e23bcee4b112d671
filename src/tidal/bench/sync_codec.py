"""Codec measurements of `tidal bench sync` on consecutive serving snapshots (workload a: a
~107M-parameter Qwen3-style model, fp32 masters, AdamW at lr 1e-6 on its own next-token loss,
served in bf16 and, beside it, as an fp8 checkpoint re-quantised from the same masters after
every step; workload b: the trainer's real steps from a short RL run).

Per step: changed fraction, tidal's bytes, the full bf16 snapshot, XOR-then-zstd-level-1 of the
same chunks (the peer), the order-0 entropy bound, and encode / decode speed as model bytes per
CPU second (process CPU time over all threads, so it is per core however many threads ran)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import zstandard

from tidal.sync.codec import decode_chunk, encode_chunk, tensor_bound_bits
from tidal.sync.origin import chunk_ranges
from tidal.sync.tensors import TensorBits, bits_of, cast_floats

STANDARD_MODEL = dict(vocab_size=32000, hidden_size=768, intermediate_size=2304, num_hidden_layers=12,
                      num_attention_heads=12, num_key_value_heads=4, head_dim=64,
                      max_position_embeddings=256, tie_word_embeddings=True)
"""Workload a's model: 107M parameters (embeddings tied)."""


def serving_snapshot(model, dtype: str = "bfloat16") -> list[TensorBits]:
    from tidal.model.checkpoint import to_hf_state_dict

    return [bits_of(k, v) for k, v in cast_floats(to_hf_state_dict(model), dtype).items()]


FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)


def quantise_fp8(w: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` as e4m3fn and its fp32 dequantisation scales (w ~ q * scale), the way fp8 serving
    checkpoints store linear weights: one scale per ``block`` x ``block`` tile of a 2-D weight
    (DeepSeek-V3's ``weight_scale_inv``), or one per tensor (``block`` 0, shape (1,))."""
    w = w.detach().float()
    if block == 0 or w.dim() != 2:
        scale = (w.abs().amax() / FP8_MAX).clamp(min=1e-12).reshape(1)
        return (w / scale).to(torch.float8_e4m3fn), scale
    rows, cols = w.shape
    rb, cb = -(-rows // block), -(-cols // block)
    tiles = torch.nn.functional.pad(w, (0, cb * block - cols, 0, rb * block - rows)).reshape(rb, block, cb, block)
    scale = (tiles.abs().amax(dim=(1, 3)) / FP8_MAX).clamp(min=1e-12)
    q = (tiles / scale[:, None, :, None]).reshape(rb * block, cb * block)[:rows, :cols]
    return q.to(torch.float8_e4m3fn).contiguous(), scale


def is_quantised(name: str, tensor: torch.Tensor) -> bool:
    """The tensors an fp8 checkpoint stores as e4m3: the decoder layers' 2-D linear weights
    (embeddings, the LM head and norms stay bf16)."""
    return tensor.dim() == 2 and name.endswith("proj.weight")


def fp8_snapshot(model, block: int = 128) -> list[TensorBits]:
    """An fp8 serving checkpoint of ``model``'s fp32 masters: e4m3fn linear weights, each with
    its fp32 ``<name>_scale_inv``, everything else bf16."""
    from tidal.model.checkpoint import to_hf_state_dict

    out = []
    for k, v in to_hf_state_dict(model).items():
        if is_quantised(k, v):
            q, scale = quantise_fp8(v, block)
            out += [bits_of(k, q), bits_of(f"{k}_scale_inv", scale)]
        else:
            out.append(bits_of(k, v.to(torch.bfloat16) if v.is_floating_point() else v))
    return out


def adamw_snapshots(steps: int, seq_len: int, batch: int, seed: int = 0):
    """Yield the bf16 serving snapshot before training and after each AdamW step (lr 1e-6) on the
    model's own next-token loss over random token sequences."""
    return (serving_snapshot(model) for model in adamw_models(steps, seq_len, batch, seed))


def adamw_models(steps: int, seq_len: int, batch: int, seed: int = 0):
    """Yield workload a's model (one object, fp32 masters) before training and after each AdamW
    step; the caller takes what it serves from it before asking for the next."""
    from tidal.model import ModelConfig, build_model

    torch.manual_seed(seed)
    model = build_model(ModelConfig(**STANDARD_MODEL), seed=seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    yield model
    for _ in range(steps):
        tokens = torch.randint(0, STANDARD_MODEL["vocab_size"], (batch, seq_len + 1))
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        yield model


def measure_step(old: list[TensorBits], new: list[TensorBits], chunk_elements: int, threads: int) -> dict:
    """One update's codec figures (tidal vs XOR+zstd-1 vs the order-0 bound vs full)."""
    ranges = chunk_ranges(new, chunk_elements)
    full = sum(t.bits.nbytes for t in new)

    def encode(r):
        i, s, n = r
        return encode_chunk(new[i].bits[s:s + n], old[i].bits[s:s + n])

    def xor_zstd(r):
        i, s, n = r
        return len(zstandard.ZstdCompressor(level=1).compress(
            np.bitwise_xor(new[i].bits[s:s + n], old[i].bits[s:s + n]).tobytes()))

    with ThreadPoolExecutor(threads) as pool:
        t0 = time.process_time()
        payloads = list(pool.map(encode, ranges))
        encode_cpu = time.process_time() - t0
        targets = [t.bits.copy() for t in old]
        t0 = time.process_time()
        list(pool.map(lambda job: decode_chunk(job[1], targets[job[0][0]][job[0][1]:job[0][1] + job[0][2]]),
                      zip(ranges, payloads)))
        decode_cpu = time.process_time() - t0
        t0 = time.process_time()
        peer = sum(pool.map(xor_zstd, ranges))
        peer_cpu = time.process_time() - t0
        t0 = time.process_time()
        list(pool.map(lambda t: t.sha256(), new))
        hash_cpu = time.process_time() - t0
        t0 = time.process_time()
        list(pool.map(lambda t: t.digest("blake3"), new))
        blake3_cpu = time.process_time() - t0
    if not all(np.array_equal(a, b.bits) for a, b in zip(targets, new)):
        raise AssertionError("decoded weights differ from the published ones")
    bound_bits, changed = 0.0, 0
    for a, b in zip(old, new):
        bits, c = tensor_bound_bits(a.bits, b.bits)
        bound_bits += bits
        changed += c
    ours = sum(len(p) for p in payloads)
    by_dtype: dict[str, int] = {}
    for (i, _, _), p in zip(ranges, payloads):
        by_dtype[new[i].dtype] = by_dtype.get(new[i].dtype, 0) + len(p)
    mb = full / 1e6
    return {
        "bytes_by_dtype": by_dtype,
        "changed_fraction": changed / sum(t.bits.size for t in new),
        "bytes": ours, "full_bytes": full, "xor_zstd_bytes": peer, "bound_bytes": bound_bits / 8,
        "ratio_vs_full": full / ours, "ratio_vs_xor_zstd": peer / ours,
        "ratio_vs_entropy_bound": ours / max(bound_bits / 8, 1e-9),
        "encode_mb_s_per_core": mb / encode_cpu, "decode_mb_s_per_core": mb / decode_cpu,
        "xor_zstd_encode_mb_s_per_core": mb / peer_cpu, "sha256_mb_s_per_core": mb / hash_cpu,
        "blake3_mb_s_per_core": mb / blake3_cpu,
    }


def receiver_throughput(old: list[TensorBits], new: list[TensorBits], cfg, repeats: int = 5) -> dict:
    """What the receiving side of one update costs on this machine, in-process (no network):
    ``apply_form`` as the puller runs it (``cfg.threads`` threads decoding in place and hashing
    by ``cfg.hash``). Wall clock: the least disturbed of ``repeats`` (a shared machine's other
    load only ever adds to it); CPU: their median. Its model bytes per wall second is the
    ``decode_bytes_per_s`` of tidal.sync.pull.predict_delivery_s."""
    from tidal.sync.client import apply_form
    from tidal.sync.origin import encode_form

    manifest, payloads = encode_form(new, old, cfg, 1, 0, [])
    known = [t.digest(manifest.hash) for t in old]
    walls, cpus = [], []
    for _ in range(repeats):
        held = [TensorBits(t.name, t.dtype, t.shape, t.bits.copy(), t.file) for t in old]
        t0, c0 = time.perf_counter(), time.process_time()
        apply_form(manifest, payloads.__getitem__, held, cfg.threads, known)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    full = sum(t.bits.nbytes for t in new)
    wall, cpu = float(np.min(walls)), float(np.median(cpus))
    return {"receive_model_bytes_per_s": full / wall, "receive_wall_s": wall,
            "receive_wall_s_median": float(np.median(walls)), "receive_cpu_s": cpu,
            "receive_model_mb_per_cpu_s": full / 1e6 / cpu, "threads": cfg.threads, "hash": manifest.hash,
            "delta_bytes": manifest.data_bytes + len(manifest.to_json()), "full_bytes": full}


def rl_snapshots(run_dir, steps: int):
    """Serving snapshots (bf16) of a short `tidal train` RL run of the default recipe: its weights
    store holds every version the trainer published; rebuilt here from the store's own files."""
    from tidal.config import load_config
    from tidal.orchestrator.loop import run_rl
    from tidal.pretrain.cache import cached_pretrained
    from tidal.sync.origin import VersionStore, rebuild

    base = load_config(None, [])
    init = cached_pretrained(base, progress=False)  # the default recipe's mid-trained model
    # fp32 master weights served in bf16 (the workload): engine.numerics "fast", since
    # "deterministic" requires the trainer to compute in the engine's dtype.
    cfg = load_config(None, ["--model.dtype", "bfloat16", "--engine.numerics", "fast", "--orchestrator.steps", str(steps),
                             "--orchestrator.backend", "local", "--orchestrator.heldout_tasks", "8",
                             "--orchestrator.eval_samples_per_task", "1", "--orchestrator.eval_every", "0",
                             "--orchestrator.checkpoint_every", "0", "--sync.transport", "http",
                             "--sync.keep_versions", str(steps + 2)])
    run_rl(cfg, run_dir, init, progress=False)
    store = VersionStore(run_dir / "weights")
    return [rebuild(store, v) for v in range(store.latest() + 1)]


def median_of(rows: list[dict], key: str) -> float:
    return float(np.median([r[key] for r in rows]))
