"""Start-up checks that each deterministic op is batch-invariant on THIS machine, and the choice
of a path that is.

Why: whether a kernel's rows depend on how many other rows share the call is a fact of one CPU,
one instruction set (oneDNN's ``ONEDNN_MAX_CPU_ISA``, ATen's ``ATEN_CPU_CAPABILITY``), one dtype
and one thread count, not a property of the op. bf16 ``F.linear`` is row-invariant on an AMD EPYC
with native bf16 and is not on an Intel Xeon without it (oneDNN's emulated bf16 path changes its
blocking with the row count). So instead of trusting facts measured elsewhere, every op of the
deterministic forward has a list of candidate paths, fastest first, and the first one that
passes its check here is the one the engine and the trainer run:

    op         candidates (first that holds wins)
    linear     fp32: onednn (packed weight) -> reduce
               bf16: native (F.linear in bf16) -> fp32-accumulate (exact upcast, packed fp32
                     oneDNN, one rounding) -> reduce
    attention  bf16 only: keys-first (unpadded, the keys as the score matmul's rows) ->
               unpadded (a decode step's q heads as they are) -> padded (at least 4 matmul
               rows) -> bf16 only: padded-fp32 (exact upcast)
    silu       torch (F.silu) -> composed (x / (1 + exp(-x)) in fp32)
    rms_norm   torch (F.rms_norm) -> composed (fp32 statistics, as qwen3.RMSNorm)
    folded_rms_norm, softmax: one path each

The check of an op: outputs for row slices of a batch (1..9, 15-17, 31-33, 63-65, 127-129 and
more rows, at two offsets) equal the same rows of the whole batch's output, bit for bit, at one
thread and at every thread count the processes may use (1, 2 and this process's), with the model's
own shapes; and the first and last rows of a call as large as the trainer's and the prefill's
(``LARGE_ROWS``) equal a small call's; a linear is checked on normal inputs and on inputs whose sums nearly cancel, where a
re-associated sum shows in a bf16 output ~100x more often (``cancelling_linear_inputs``). The
order is fixed and the choice does not depend on timings, so every process on one machine
chooses the same paths (the engine's actors and the trainer agree). The reduce linear (no GEMM:
products summed by ATen's row reduction) is the last resort; if even the last candidate fails,
the deterministic mode refuses to start (``DeterminismUnavailable``) instead of running
"deterministic" while being wrong.

Costs: each candidate's time per call at 16 rows is measured for ``tidal doctor``; it never
decides anything. The whole probe takes about a second per dtype on the tiny presets
(docs/numerics.md) and is cached per (shapes, dtype, threads) for the process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tidal.numerics.invariance import (  # noqa: F401  (probe.<name> is where tests and docs look)
    LARGE_ROWS,
    PROBE_BATCH,
    _each_thread_count,
    _inputs,
    _same_bits,
    _time_us,
    cancelling_linear_inputs,
    large_rows,
    large_rows_invariant,
    probe_threads,
    rows_invariant,
)

LONG_KEYS = 512
"""Tokens of the sequences attention is also checked at (a trainer's rows are whole sequences,
up to engine.max_seq_len, 256 by default; the default model's max_position_embeddings is 512):
a query alone against a longer cache must equal its row of the batch's causal attention."""
class DeterminismUnavailable(RuntimeError):
    """No candidate path of a deterministic op is batch-invariant on this machine."""


@dataclass(frozen=True)
class ProbeShapes:
    """The sizes the model's deterministic ops run at (read off a ModelConfig by duck typing:
    numerics never imports the model)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    matrices: tuple[tuple[int, int], ...]
    """(out, in) of every distinct linear."""
    widths: tuple[int, ...]
    """Last-dim widths of silu inputs (intermediate sizes)."""
    experts: int = 0
    """MoE experts per layer (0: dense)."""
    expert_inter: int = 0
    """An expert's intermediate size."""

    @classmethod
    def of_model(cls, cfg) -> ProbeShapes:
        h, d = cfg.hidden_size, cfg.head_dim
        q, kv = cfg.num_attention_heads, cfg.num_key_value_heads
        mats = {((q + 2 * kv) * d, h), (h, q * d), (cfg.vocab_size, h)}
        if cfg.num_experts:
            e, i = cfg.num_experts, cfg.moe_intermediate_size
            mats |= {(e, h), (2 * i, h), (h, i), (e + e * 2 * i, h), (h, e * i)}
            widths = (i,)
        else:
            e, i = 0, 0
            mats |= {(2 * cfg.intermediate_size, h), (h, cfg.intermediate_size)}
            widths = (cfg.intermediate_size,)
        return cls(h, q, kv, d, tuple(sorted(mats)), widths, e, i)


DEFAULT_SHAPES = ProbeShapes(hidden=192, heads=6, kv_heads=2, head_dim=32,
                             matrices=((8, 192), (192, 128), (192, 192), (256, 192), (260, 192),
                                       (320, 192), (1024, 192), (2056, 192), (192, 512)),
                             widths=(128, 512), experts=8, expert_inter=128)
"""The tiny presets' shapes (dense and MoE): what `tidal doctor` probes without a model."""


@dataclass
class CandidateResult:
    path: str
    holds: bool
    us_per_call: float | None
    """Time of one call at 16 rows (a decode step's size) at this process's thread count;
    None if not timed."""
    failure: str = ""


@dataclass
class ProbeResult:
    op: str
    dtype: str
    path: str | None
    """The chosen path: the first candidate that holds; None if none does."""
    candidates: list[CandidateResult] = field(default_factory=list)
    threads: tuple[int, ...] = ()
    by_shape: dict[tuple[int, int], str] = field(default_factory=dict)
    """linear only: matrices [out, in] on which an earlier (faster) candidate than ``path`` holds,
    and that candidate; the others run ``path``."""

    @property
    def holds(self) -> bool:
        return self.path is not None

    def as_dict(self) -> dict:
        return {"op": self.op, "dtype": self.dtype, "path": self.path, "holds": self.holds,
                "threads": list(self.threads),
                "candidates": [{"path": c.path, "holds": c.holds, "us_per_call": c.us_per_call,
                                "failure": c.failure} for c in self.candidates],
                "by_shape": {shape_name(m): path for m, path in self.by_shape.items()}}


@dataclass(frozen=True)
class NumericsPaths:
    """The path of each deterministic op for one dtype on this machine."""

    dtype: torch.dtype
    linear: str
    attention: str
    silu: str
    rms_norm: str
    moe_stacked: bool
    """The MoE's few-token route (numerics/moe.py) gives the per-expert route's bits here."""
    results: tuple[ProbeResult, ...] = ()
    linear_by_shape: dict[tuple[int, int], str] = field(default_factory=dict)
    """(out, in) -> path: matrices that run a faster linear path than ``linear``, which held at
    their shape (the linear probe's ``by_shape``); every other matrix runs ``linear``."""

    def linear_path(self, shape: tuple[int, ...]) -> str:
        """The linear path of a matrix [out, in]: its own where the probe found a faster one that
        holds at its shape, else the one that holds at every probed shape."""
        return self.linear_by_shape.get(tuple(shape), self.linear)

    def describe(self) -> str:
        """The run's ``numerics:`` line (after the mode), as the engine and the trainer run."""
        own = "".join(f" {shape_name(m)}={path}" for m, path in self.linear_by_shape.items())
        return (f"deterministic {str(self.dtype).removeprefix('torch.')}: linear={self.linear} "
                + (f"(by shape:{own}) " if own else "")
                + f"attention={self.attention} silu={self.silu} rms_norm={self.rms_norm} "
                f"moe_stacked={'on' if self.moe_stacked else 'off'}")


# ------------------------------------------------------------------ the checks


def shape_name(shape: tuple[int, ...]) -> str:
    """A matrix shape as the records and lines name it: (192, 512) -> "192x512"."""
    return "x".join(map(str, shape))


def _probe_linear(dtype: torch.dtype, shapes: ProbeShapes, threads) -> ProbeResult:
    """The first candidate that holds at every matrix shape is ``path``; a matrix on which an
    earlier candidate holds runs that one (``by_shape``). Why per shape: a kernel can be
    row-invariant at one input width and not at another, and the fallback costs more (bf16
    fp32-accumulate against native: docs/numerics.md)."""
    from tidal.numerics.ops import LINEAR_PATHS, DeterministicLinear

    largest = max(shapes.matrices, key=lambda m: m[0] * m[1])

    def failure_at(path: str, out_dim: int, in_dim: int) -> str:
        weight = _inputs(out_dim, in_dim, dtype, seed=out_dim * 7 + in_dim)
        try:
            linear = DeterministicLinear(weight, path)
        except ValueError as exc:  # the path needs what this build lacks (oneDNN)
            return str(exc)
        x = _inputs(PROBE_BATCH, in_dim, dtype, seed=in_dim)
        failure = rows_invariant(linear, x, threads)
        if not failure:  # the same matrix shape on inputs where a re-associated sum shows
            x_c, weight_c = cancelling_linear_inputs(PROBE_BATCH, out_dim, in_dim, dtype,
                                                     seed=out_dim * 7 + in_dim)
            failure = rows_invariant(DeterministicLinear(weight_c, path), x_c, threads)
            failure = failure and f"{failure}, cancelling inputs"
        if not failure and large_rows(out_dim, in_dim):
            x_large = _inputs(large_rows(out_dim, in_dim), in_dim, dtype, seed=in_dim + 1)
            failure = large_rows_invariant(linear, x_large, threads)
        return failure

    result = ProbeResult("linear", _name(dtype), None, threads=threads)
    held: dict[str, set[tuple[int, int]]] = {}
    for path in LINEAR_PATHS[dtype]:
        failures = {m: failure_at(path, *m) for m in shapes.matrices}
        held[path] = {m for m, failure in failures.items() if not failure}
        broken = [(m, f) for m, f in failures.items() if f]
        us = None
        if not broken:
            weight = _inputs(*largest, dtype, seed=largest[0] * 7 + largest[1])
            us = _time_us(DeterministicLinear(weight, path), _inputs(16, largest[1], dtype, seed=1))
        failure = "; ".join(f"[{shape_name(m)}] {f}" for m, f in broken[:1])
        if broken and held[path]:
            failure += f" (holds at {len(held[path])} of {len(failures)} shapes)"
        result.candidates.append(CandidateResult(path, not broken, us, failure))
        if not broken:
            result.path = path
            break
    if result.path is not None:
        for m in shapes.matrices:
            faster = next((p for p in held if p != result.path and m in held[p]), None)
            if faster is not None:
                result.by_shape[m] = faster
    return result


def _probe_attention(dtype: torch.dtype, shapes: ProbeShapes, threads) -> ProbeResult:
    """One query against a longer cache (garbage past it) vs the same query in a causal batch,
    in decode batches of several sizes: attention's rows must not see the key length or other
    rows."""
    from tidal.numerics.ops import ATTENTION_PATHS, KEY_BLOCK, attention, attention_bias

    result = ProbeResult("attention", _name(dtype), None, threads=threads)
    g = torch.Generator().manual_seed(0)
    b, t, d, length = 3, 70, shapes.head_dim, 2 * KEY_BLOCK
    q = torch.randn(b, t, shapes.heads, d, generator=g).to(dtype)
    k = torch.randn(b, shapes.kv_heads, 3 * KEY_BLOCK, d, generator=g).to(dtype)
    v = torch.randn(b, shapes.kv_heads, 3 * KEY_BLOCK, d, generator=g).to(dtype)

    # a trainer's rows: whole sequences of up to LONG_KEYS tokens, several in one call
    ql = torch.randn(4, LONG_KEYS, shapes.heads, d, generator=g).to(dtype)
    kl = torch.randn(4, shapes.kv_heads, LONG_KEYS + KEY_BLOCK, d, generator=g).to(dtype)
    vl = torch.randn(4, shapes.kv_heads, LONG_KEYS + KEY_BLOCK, d, generator=g).to(dtype)

    def failure_of(path: str) -> str:
        for n in _each_thread_count(threads):
            full = attention(q, k[:, :, :length], v[:, :, :length],
                             attention_bias(torch.arange(t).expand(b, t), length), path)
            for pos in (0, 1, 5, 31, 63, 64, 69):
                for rows in (1, 2, 3):
                    one = attention(q[:rows, pos : pos + 1], k[:rows], v[:rows],
                                    attention_bias(torch.full((rows, 1), pos), 3 * KEY_BLOCK), path)
                    if not _same_bits(one, full[:rows, pos : pos + 1]):
                        return f"query {pos} alone ({rows} rows, {n} threads)"
            full = attention(ql, kl[:, :, :LONG_KEYS], vl[:, :, :LONG_KEYS],
                             attention_bias(torch.arange(LONG_KEYS).expand(4, LONG_KEYS), LONG_KEYS), path)
            for pos in (KEY_BLOCK * 2 + 7, LONG_KEYS // 2, LONG_KEYS - 1):
                one = attention(ql[:1, pos : pos + 1], kl[:1], vl[:1],
                                attention_bias(torch.full((1, 1), pos), LONG_KEYS + KEY_BLOCK), path)
                if not _same_bits(one, full[:1, pos : pos + 1]):
                    return f"query {pos} of a {LONG_KEYS}-token sequence alone ({n} threads)"
        return ""

    bias = attention_bias(torch.full((b, 1), 40), length)

    def check(path: str) -> tuple[str, float | None]:
        return failure_of(path), _time_us(
            lambda x: attention(x, k[:, :, :length], v[:, :, :length], bias, path), q[:, :1])

    return _first_that_holds(result, ATTENTION_PATHS[dtype], check)


def _probe_rowwise(op: str, dtype: torch.dtype, widths: tuple[int, ...], threads) -> ProbeResult:
    from tidal.numerics.ops import ROWWISE_PATHS, rowwise_op

    def check(path: str) -> tuple[str, float | None]:
        fn = rowwise_op(op, path)
        us = None
        for width in widths:
            # silu runs on the gate half of a [rows, 2 * width] matrix: a strided view
            x = _inputs(PROBE_BATCH, 2 * width, dtype, seed=width, scale=3.0)[:, :width]
            x_large = _inputs(LARGE_ROWS, 2 * width, dtype, seed=width + 1, scale=3.0)[:, :width]
            failure = rows_invariant(fn, x, threads) or large_rows_invariant(fn, x_large, threads)
            if failure:
                return f"[width {width}] {failure}", None
            us = _time_us(fn, x[:16])
        return "", us

    return _first_that_holds(ProbeResult(op, _name(dtype), None, threads=threads),
                             ROWWISE_PATHS[op], check)


def _first_that_holds(result: ProbeResult, paths, check) -> ProbeResult:
    """Try ``paths`` in order with ``check(path) -> (failure, us per call)``, recording each,
    until one holds (its path is the result's)."""
    for path in paths:
        failure, us = check(path)
        result.candidates.append(CandidateResult(path, not failure, us, failure))
        if not failure:
            result.path = path
            break
    return result


def _probe_moe_stacked(dtype: torch.dtype, shapes: ProbeShapes, linear_path: str | None,
                       threads) -> ProbeResult:
    """numerics/moe.py's few-token route: a column of the stacked [router; experts' gate_up]
    matmul must have the bits of the same column of each matrix's own matmul, and a down
    projection over all experts' matrices side by side, zero outside one expert's block, the bits
    of that expert's own. Only tried on the packed fp32 linear (elsewhere it is not faster)."""
    from tidal.numerics.ops import DeterministicLinear

    result = ProbeResult("moe_stacked", _name(dtype), None, threads=threads)
    if not shapes.experts or dtype != torch.float32 or linear_path != "onednn":
        result.path = "off"
        result.candidates.append(CandidateResult("off", True, None))
        return result
    e, i, h = shapes.experts, shapes.expert_inter, shapes.hidden
    router = _inputs(e, h, dtype, seed=1)
    gate_up = _inputs(e * 2 * i, h, dtype, seed=2)
    down = _inputs(h, e * i, dtype, seed=3)
    stacked = DeterministicLinear(torch.cat((router, gate_up)), linear_path)
    own = [DeterministicLinear(router, linear_path)] + [
        DeterministicLinear(gate_up[j * 2 * i : (j + 1) * 2 * i], linear_path) for j in range(e)]
    downs = DeterministicLinear(down, linear_path)
    own_down = [DeterministicLinear(down[:, j * i : (j + 1) * i].contiguous(), linear_path)
                for j in range(e)]

    def failure_of() -> str:
        for n in _each_thread_count(threads):
            for rows in (1, 2, 3, 5, 8, 17, 33, 64):
                x = _inputs(rows, h, dtype, seed=rows)
                if not _same_bits(torch.cat([m(x) for m in own], 1), stacked(x)):
                    return f"stacked gate_up, {rows} rows, {n} threads"
                act = _inputs(rows, i, dtype, seed=rows + 100)
                for j in (0, e - 1):
                    blocks = act.new_zeros(rows, e, i)
                    blocks[:, j] = act
                    if not _same_bits(downs(blocks.flatten(1)), own_down[j](act)):
                        return f"stacked down, expert {j}, {rows} rows, {n} threads"
        return ""

    with torch.no_grad():
        failure = failure_of()
    result.candidates.append(CandidateResult("on", not failure, None, failure))
    result.path = "off" if failure else "on"
    if failure:
        result.candidates.append(CandidateResult("off", True, None))
    return result


def _strict_hint() -> str:
    """Why the paths may fail here and not in a fresh process: mid-training ran in this one."""
    from tidal.numerics import mkl_cnr

    if not mkl_cnr.strict_active():
        return ""
    return ("; MKL runs in its strict reproducible mode in this process (mid-training ran here, "
            "numerics/mkl_cnr.py), which changes its small matmuls: run mid-training in a process "
            "of its own (`tidal pretrain`, or pretrain.loop.pretrain_in_child), as `tidal train` does")


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


_CACHE: dict[tuple[ProbeShapes, torch.dtype, tuple[int, ...]], NumericsPaths] = {}


def probe(dtype: torch.dtype, shapes: ProbeShapes = DEFAULT_SHAPES) -> list[ProbeResult]:
    """Every op's probe for ``dtype`` at ``shapes`` on this machine (uncached)."""
    threads = probe_threads()
    linear = _probe_linear(dtype, shapes, threads)
    return [
        linear,
        _probe_attention(dtype, shapes, threads),
        _probe_rowwise("silu", dtype, shapes.widths, threads),
        _probe_rowwise("rms_norm", dtype, (shapes.hidden, shapes.head_dim), threads),
        _probe_rowwise("folded_rms_norm", dtype, (shapes.hidden, shapes.head_dim), threads),
        _probe_rowwise("softmax", torch.float32, (shapes.hidden, 3 * 64), threads),
        _probe_moe_stacked(dtype, shapes, linear.path, threads),
    ]


def choose_paths(dtype: torch.dtype, shapes: ProbeShapes = DEFAULT_SHAPES) -> NumericsPaths:
    """The deterministic paths for ``dtype`` here (probed once per process and shapes); raises
    DeterminismUnavailable naming the op if no path of it holds."""
    key = (shapes, dtype, probe_threads())
    if key not in _CACHE:
        results = probe(dtype, shapes)
        broken = [r for r in results if not r.holds]
        if broken:
            detail = "; ".join(f"{r.op}: " + ", ".join(f"{c.path} ({c.failure})" for c in r.candidates)
                               for r in broken)
            raise DeterminismUnavailable(
                f"no batch-invariant path for {_name(dtype)} on this machine ({detail}); run with "
                "engine.numerics = \"fast\" (logprobs then differ from the trainer's in the last bits)"
                + _strict_hint())
        by_op = {r.op: r for r in results}
        chosen = {op: r.path for op, r in by_op.items()}
        _CACHE[key] = NumericsPaths(dtype, chosen["linear"], chosen["attention"], chosen["silu"],
                                    chosen["rms_norm"], chosen["moe_stacked"] == "on",
                                    tuple(results), dict(by_op["linear"].by_shape))
    return _CACHE[key]


def probe_report(dtype: torch.dtype | None = None, shapes: ProbeShapes = DEFAULT_SHAPES) -> list[dict]:
    """`tidal doctor`'s table: every op's candidates, which hold, their cost, the chosen path;
    for ``dtype`` or for fp32 and bf16."""
    dtypes = [dtype] if dtype is not None else [torch.float32, torch.bfloat16]
    return [r.as_dict() for dt in dtypes for r in probe(dt, shapes)]


def clear_cache() -> None:
    """Forget probed choices (tests that inject a failing path)."""
    _CACHE.clear()
