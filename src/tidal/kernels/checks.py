"""Kernel checks for a device run: each batch-invariant kernel against plain torch, and invariant.

``run_kernel_checks(device)`` returns one record per check: ``{"name", "ok", "detail"}`` where
detail holds the measured error or the first failure. Every check runs even if one fails (this
is the first section of a one-shot GPU script), and records a raised error as a failure.
The kernels: the Triton ones (``triton_kernels``; on CUDA, or on the CPU in Triton's
interpreter) or their pure-torch references (``reference_kernels``, reference.py: runs anywhere).
Checked: close to torch (relative error of bf16 size), and batch invariance: a row's output is
bitwise the same alone, in a prefix, or in a shuffled batch; attention also decode vs prefill.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

REL_TOL = 2e-2
"""Largest |kernel - torch| / max|torch| accepted (bf16 outputs round at ~4e-3)."""


@dataclass(frozen=True)
class Dims:
    """Problem sizes of the checks: rows, widths, attention cache length, head size."""

    rows: int
    width: int
    vocab: int
    keys: int
    head_dim: int


FULL = Dims(rows=300, width=512, vocab=5000, keys=200, head_dim=64)
SMALL = Dims(rows=24, width=96, vocab=300, keys=70, head_dim=16)
"""For Triton's interpreter, which runs each program in Python."""


@dataclass(frozen=True)
class Kernels:
    """The kernels under check, each with its torch-like signature."""

    name: str
    linear: Callable  # (x [M, K], w [N, K], out_dtype | None) -> [M, N]
    rms_norm: Callable  # (x, weight [H], eps) -> x's shape
    softmax: Callable  # (x, log: bool) -> fp32
    attention: Callable  # (q [N, Hq, D], k/v caches [S, Hkv, L, D], slot, pos, scale) -> [N, Hq, D]
    experts: Callable  # (x [M, H], ids/gates [M, k], gate_up [E, 2I, H], down [E, H, I]) -> [M, H]


def triton_kernels() -> Kernels:
    from tidal.kernels import attention, matmul, rowwise
    from tidal.kernels.triton_ops import TritonOps

    return Kernels("triton", lambda x, w, out_dtype=None: matmul.linear(x, w, out_dtype),
                   rowwise.rms_norm, rowwise.softmax, attention.attention, TritonOps().experts)


def reference_kernels() -> Kernels:
    from tidal.kernels import reference

    return Kernels("reference", reference.linear, reference.rms_norm, reference.softmax,
                   reference.attention, reference.experts)


def run_kernel_checks(device, kernels: Kernels | None = None, small: bool = False) -> list[dict]:
    """Run every check on ``device`` with ``kernels`` (default: Triton on CUDA or under
    TRITON_INTERPRET=1, else the references); ``small`` shrinks the problems (for Triton's
    interpreter)."""
    dims = SMALL if small else FULL
    device = torch.device(device)
    if kernels is None:
        interpreted = os.environ.get("TRITON_INTERPRET") == "1"
        kernels = triton_kernels() if device.type == "cuda" or interpreted else reference_kernels()
    gen = torch.Generator(device="cpu").manual_seed(0)
    checks = [_linear, _linear_fp32_out, _rms_norm, _log_softmax, _softmax, _attention, _experts]
    records = []
    for check in checks:
        name = check.__name__.lstrip("_")
        try:
            ok, detail = check(kernels, device, gen, dims)
        except Exception as exc:  # noqa: BLE001 - report every check (module docstring)
            traceback.print_exc()
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        print(f"kernel check {name:<16} {'ok' if ok else 'FAILED'}  {detail}  ({kernels.name})")
        records.append({"name": name, "ok": ok, "detail": detail, "kernels": kernels.name})
    return records


def _randn(gen, *shape, device, dtype=torch.bfloat16, scale=1.0):
    return (torch.randn(shape, generator=gen) * scale).to(device=device, dtype=dtype)


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    want = want.float()
    return float((got.float() - want).abs().max() / want.abs().max().clamp_min(1e-30))


def _row_invariant(fn, x_rows: int, full: torch.Tensor, device, gen) -> str | None:
    """None if fn(rows) equals full[rows] bitwise for prefixes and a shuffle, else what differed."""
    for m in (1, 2, 3, 17, 64, 65, x_rows):
        idx = torch.arange(min(m, x_rows), device=device)
        if not torch.equal(fn(idx), full[idx]):
            return f"rows 0..{m - 1} differ from the same rows in the full batch"
    perm = torch.randperm(x_rows, generator=gen).to(device)
    if not torch.equal(fn(perm), full[perm]):
        return "a shuffled batch differs"
    return None


def _result(err: float, invariance: str | None) -> tuple[bool, str]:
    ok = err <= REL_TOL and invariance is None
    return ok, f"rel_err={err:.2e}" + ("" if invariance is None else f"; NOT INVARIANT: {invariance}")


def _linear(det, device, gen, dims):
    m, k = dims.rows, dims.width
    x, w = _randn(gen, m, k, device=device), _randn(gen, 3 * k // 4, k, device=device)
    full = det.linear(x, w)
    err = _rel_err(full, x.float() @ w.float().T)
    return _result(err, _row_invariant(lambda i: det.linear(x[i], w), m, full, device, gen))


def _linear_fp32_out(det, device, gen, dims):
    m, k = dims.rows // 2 + 1, dims.width // 2
    x, w = _randn(gen, m, k, device=device), _randn(gen, dims.vocab // 5, k, device=device)
    full = det.linear(x, w, torch.float32)
    err = _rel_err(full, x.float() @ w.float().T)
    inv = _row_invariant(lambda i: det.linear(x[i], w, torch.float32), m, full, device, gen)
    return _result(err, inv)


def _rms_norm(det, device, gen, dims):
    m, k = dims.rows, dims.width * 3 // 4
    x, w = _randn(gen, m, k, device=device), _randn(gen, k, device=device)
    full = det.rms_norm(x, w, 1e-6)
    err = _rel_err(full, F.rms_norm(x, (k,), w, 1e-6))
    return _result(err, _row_invariant(lambda i: det.rms_norm(x[i], w, 1e-6), m, full, device, gen))


def _log_softmax(det, device, gen, dims):
    m = dims.rows // 4 + 1
    x = _randn(gen, m, dims.vocab, device=device, dtype=torch.float32, scale=3.0)
    full = det.softmax(x, log=True)
    err = _rel_err(full, torch.log_softmax(x, -1))
    return _result(err, _row_invariant(lambda i: det.softmax(x[i], log=True), m, full, device, gen))


def _softmax(det, device, gen, dims):
    x = _randn(gen, dims.rows, 32, device=device, dtype=torch.float32, scale=3.0)
    full = det.softmax(x, log=False)
    err = _rel_err(full, torch.softmax(x, -1))
    inv = _row_invariant(lambda i: det.softmax(x[i], log=False), dims.rows, full, device, gen)
    return _result(err, inv)


def _attention(det, device, gen, dims):
    """Random caches; queries at random (slot, position); then one sequence as prefill (all
    positions in one call) vs decode (one position per call)."""
    slots, hkv, hq, length, d, n = 4, 2, 8, dims.keys, dims.head_dim, dims.rows
    k_cache = _randn(gen, slots, hkv, length, d, device=device)
    v_cache = _randn(gen, slots, hkv, length, d, device=device)
    q = _randn(gen, n, hq, d, device=device)
    slot = torch.randint(0, slots, (n,), generator=gen).to(device)
    pos = torch.randint(0, length, (n,), generator=gen).to(device)
    scale = d ** -0.5
    full = det.attention(q, k_cache, v_cache, slot, pos, scale)
    want = _masked_attention(q, k_cache, v_cache, slot, pos, scale)
    err = _rel_err(full, want)
    inv = _row_invariant(lambda i: det.attention(q[i], k_cache, v_cache, slot[i], pos[i], scale),
                         n, full, device, gen)
    seq = length - 1
    seq_q = _randn(gen, seq, hq, d, device=device)
    seq_slot = torch.zeros(seq, dtype=torch.long, device=device)
    seq_pos = torch.arange(seq, device=device)
    prefill = det.attention(seq_q, k_cache, v_cache, seq_slot, seq_pos, scale)
    for p in sorted({0, 1, 63, 64, 65, seq - 1} & set(range(seq))):
        one = det.attention(seq_q[p : p + 1], k_cache, v_cache, seq_slot[p : p + 1],
                             seq_pos[p : p + 1], scale)
        if not torch.equal(one, prefill[p : p + 1]) and inv is None:
            inv = f"decode at position {p} differs from prefill"
    return _result(err, inv)


def _masked_attention(q, k_cache, v_cache, slot, pos, scale):
    """fp32 softmax(q k^T) v over 0..pos, GQA by repeating kv heads (the oracle)."""
    group = q.shape[1] // k_cache.shape[1]
    k = k_cache[slot].float().repeat_interleave(group, 1)  # [N, Hq, L, D]
    v = v_cache[slot].float().repeat_interleave(group, 1)
    s = torch.einsum("nhd,nhld->nhl", q.float(), k) * scale
    keys = torch.arange(k.shape[2], device=q.device)
    s = s.masked_fill(keys[None, None, :] > pos[:, None, None], float("-inf"))
    return torch.einsum("nhl,nhld->nhd", torch.softmax(s, -1), v)


def _experts(det, device, gen, dims):
    m, hidden, inter, experts, k = dims.rows, dims.width // 2, dims.width // 4, 8, 2
    x = _randn(gen, m, hidden, device=device)
    gate_up = _randn(gen, experts, 2 * inter, hidden, device=device, scale=0.05)
    down = _randn(gen, experts, hidden, inter, device=device, scale=0.05)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(m)]).to(device)
    weights = torch.rand((m, k), generator=gen).to(device)
    full = det.experts(x, ids, weights, gate_up, down)
    err = _rel_err(full, _dense_experts(x, ids, weights, gate_up, down))
    inv = _row_invariant(lambda i: det.experts(x[i], ids[i], weights[i], gate_up, down), m, full,
                         device, gen)
    return _result(err, inv)


def _dense_experts(x, ids, weights, gate_up, down):
    """fp32 oracle: every expert on every token, then each token's k picked and weighted."""
    gate, up = torch.einsum("mh,eoh->meo", x.float(), gate_up.float()).chunk(2, dim=-1)
    y = torch.einsum("mei,ehi->meh", F.silu(gate) * up, down.float())  # [M, E, H]
    picked = y.gather(1, ids[..., None].expand(-1, -1, y.shape[-1]))  # [M, k, H]
    return (picked * weights.float()[..., None]).sum(1)
