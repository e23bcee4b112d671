"""The delta codec: what a chunk of one tensor's bit patterns travels as, and back, bit-exact.

Here are the five chunk kinds with their encoder and decoder, the two entropy coders they are
built from (Rice codes for the gaps between changed elements, rANS for the differences), and the
order-0 entropy bound the codec is measured against (`tidal bench sync`). It sees only unsigned
integer numpy arrays: no torch, no network, no files.
"""

from __future__ import annotations

import struct

import constriction
import numpy as np
import zstandard


# ── Chunk kinds ───────────────────────────────────────────────────────────────────────────────────
# The chunk codec: lossless, bit-exact, for any dtype (it sees only unsigned-int bit patterns).
#
# A chunk is a run of one tensor's elements. Its payload starts with one kind byte:
#
# - RAW      the new bit patterns as they are (anchors; the fallback when nothing else is smaller).
# - SPARSE   an RL update changes few elements, mostly by a few units in the last place. Which
#            elements changed: gaps between them, Rice-coded (below; ~n·H(p) bits). By how much:
#            new − old as wrapping integers of the element's width, rANS-coded with the chunk's
#            own table of distinct differences and their counts (below; ~the empirical entropy).
# - DENSE    when many elements changed (a large learning rate, a small model): every element's
#            new − old difference, zeros included, rANS-coded with the chunk's table. The zero
#            symbol carries the "which changed" information, so this too costs ~n·H(p) + c·H(diff).
# - XOR_ZSTD the peer's method (XOR with the base, zstd level 1): kept when it is smaller (e.g.
#            fp32 masters whose differences are too varied for a table to pay off).
# - PAIRED   SPARSE's positions, with the differences split the way an RL update's are (~90% are
#            ±1 unit in the last place): one bit per difference picks between the two commonest
#            values, and the rest ("exceptions": their places among the differences Rice-coded,
#            their values rANS-coded with their own table) overwrite. The same information as
#            SPARSE's one rANS stream (the entropy splits exactly so), within ~1% of its size, but
#            its differences decode ~3x faster (workload a: 44-50 -> ~15 ms of CPU): rANS
#            (constriction) holds the GIL for every symbol, so SPARSE decoding is serial across
#            threads; here rANS sees only the exceptions and the rest is numpy that vectorises.
#
# The encoder keeps the smallest, except that PAIRED replaces SPARSE when it is at most
# ``PAIRED_SLACK`` larger (decode time is what a puller waits for); the decoder applies the
# payload in place to the base's bits.

RAW, SPARSE, XOR_ZSTD, DENSE, PAIRED = 0, 1, 2, 3, 4
SPARSE_KINDS = (SPARSE, PAIRED)
"""Kinds that name changed positions and differences (``changes`` reads both)."""
SPARSE_HEADER = struct.Struct("<BIIIII")
"""k, changed elements, unary bytes, remainder bytes, table size, ANS words."""
DENSE_HEADER = struct.Struct("<II")
"""table size, ANS words."""
PAIRED_HEADER = struct.Struct("<BIIIBIIIII")
"""k, changed elements, unary bytes, remainder bytes; exceptions' k, exceptions, their unary
bytes, their remainder bytes; exception table size, ANS words."""
PAIRED_SLACK = 0.02
"""PAIRED is kept over SPARSE when at most this fraction larger (its differences decode ~3x
faster, mostly outside the GIL)."""
DENSE_FRACTION = 0.25
"""Above this changed fraction the sparse coding is not tried (the zstd path is smaller)."""
ZSTD_LEVEL = 1


def encode_chunk(new: np.ndarray, old: np.ndarray | None = None) -> bytes:
    """Payload that turns ``old`` into ``new`` (both flat unsigned arrays of one width), or the
    raw ``new`` when ``old`` is None."""
    raw = bytes([RAW]) + new.tobytes()
    if old is None:
        return raw
    changed = np.flatnonzero(new != old)
    candidates = [raw]
    table_size = None
    if changed.size <= DENSE_FRACTION * new.size:
        payload, table_size, paired = _encode_sparse(new, old, changed)
        candidates.append(paired if paired is not None and len(paired) <= (1 + PAIRED_SLACK) * len(payload)
                          else payload)
    if table_size is None or table_size * 4 > changed.size:
        candidates.append(bytes([XOR_ZSTD]) + zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(
            np.bitwise_xor(new, old).tobytes()))
        if table_size is None:
            candidates.append(_encode_dense(new - old))
    return min(candidates, key=len)


def _encode_table(values: np.ndarray, counts: np.ndarray) -> bytes:
    return values.astype(values.dtype.newbyteorder("<")).tobytes() + counts.astype("<u4").tobytes()


def _encode_dense(diffs: np.ndarray) -> bytes:
    values, symbols, counts = np.unique(diffs, return_inverse=True, return_counts=True)
    words = ans_encode(symbols, counts) if values.size > 1 else np.zeros(0, np.uint32)
    return b"".join([bytes([DENSE]), DENSE_HEADER.pack(values.size, words.size),
                     _encode_table(values, counts), words.astype("<u4").tobytes()])


def _encode_sparse(new: np.ndarray, old: np.ndarray,
                   changed: np.ndarray) -> tuple[bytes, int, bytes | None]:
    """(SPARSE payload, its table size, PAIRED payload of the same changes or None)."""
    diffs = new[changed] - old[changed]  # wraps modulo 2**width: exact for every bit pattern
    values, symbols, counts = np.unique(diffs, return_inverse=True, return_counts=True)
    gaps = np.diff(changed, prepend=-1).astype(np.uint64) - np.uint64(1)
    k = best_rice_parameter(gaps)
    unary, remainders = rice_encode(gaps, k)
    words = ans_encode(symbols, counts) if values.size > 1 else np.zeros(0, np.uint32)
    header = SPARSE_HEADER.pack(k, changed.size, len(unary), len(remainders), values.size, words.size)
    parts = [bytes([SPARSE]), header, _encode_table(values, counts), unary, remainders,
             words.astype("<u4").tobytes()]
    paired = (_encode_paired(values, symbols, counts, k, unary, remainders)
              if changed.size and values.size > 1 else None)
    return b"".join(parts), int(values.size), paired


def _encode_paired(values: np.ndarray, symbols: np.ndarray, counts: np.ndarray, k: int, unary: bytes,
                   remainders: bytes) -> bytes:
    """PAIRED: the differences (``values[symbols]``) as a bit between the two commonest values,
    and the others as exceptions (their places among the differences, and their values)."""
    a, b = np.argsort(-counts.astype(np.int64), kind="stable")[:2]
    pair = values[[a, b]]
    is_exception = (symbols != a) & (symbols != b)
    places = np.flatnonzero(is_exception)
    selector = np.packbits(symbols[~is_exception] == b).tobytes()
    gaps = np.diff(places, prepend=-1).astype(np.uint64) - np.uint64(1)
    ek = best_rice_parameter(gaps)
    e_unary, e_remainders = rice_encode(gaps, ek) if places.size else (b"", b"")
    e_values, e_symbols, e_counts = np.unique(values[symbols[places]], return_inverse=True,
                                              return_counts=True)
    words = ans_encode(e_symbols, e_counts) if e_values.size > 1 else np.zeros(0, np.uint32)
    header = PAIRED_HEADER.pack(k, symbols.size, len(unary), len(remainders), ek, places.size,
                                len(e_unary), len(e_remainders), e_values.size, words.size)
    return b"".join([bytes([PAIRED]), header, pair.astype(pair.dtype.newbyteorder("<")).tobytes(),
                     _encode_table(e_values, e_counts), unary, remainders, e_unary, e_remainders,
                     selector, words.astype("<u4").tobytes()])


def decode_chunk(payload: bytes | memoryview, target: np.ndarray) -> None:
    """Apply ``payload`` to ``target`` (the base's bits for a delta; any bits for RAW) in place."""
    kind = payload[0]
    body = memoryview(payload)[1:]
    if kind == RAW:
        target[:] = np.frombuffer(body, dtype=target.dtype.newbyteorder("<"), count=target.size)
    elif kind == XOR_ZSTD:
        xor = zstandard.ZstdDecompressor().decompress(body, max_output_size=target.nbytes)
        np.bitwise_xor(target, np.frombuffer(xor, dtype=target.dtype.newbyteorder("<")), out=target)
    elif kind in SPARSE_KINDS:
        changed, diffs = changes(payload, target)
        target[changed] += diffs
    elif kind == DENSE:
        _decode_dense(body, target)
    else:
        raise ValueError(f"unknown chunk kind {kind}")


def changes(payload: bytes | memoryview, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions, new − old differences) a SPARSE or PAIRED payload names in a chunk of
    ``target``'s size and dtype; the caller applies them (and can undo them)."""
    body = memoryview(payload)[1:]
    return paired_changes(body, target) if payload[0] == PAIRED else sparse_changes(body, target)


def _positions(unary, remainders, k: int, n: int, size: int, what: str) -> np.ndarray:
    """n strictly increasing positions below ``size`` from Rice-coded gaps."""
    if n == 0:
        return np.zeros(0, np.int64)
    places = rice_positions(unary, remainders, k, n)
    if int(places[-1]) >= size:
        raise ValueError(f"{what} past the end")
    return places


def paired_changes(body: memoryview, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``changes`` of a PAIRED payload's body (after the kind byte)."""
    k, n, unary_len, rem_len, ek, n_exc, e_unary_len, e_rem_len, nsym, nwords = PAIRED_HEADER.unpack_from(body)
    dtype = target.dtype
    pos = PAIRED_HEADER.size
    pair = np.frombuffer(body, dtype=dtype.newbyteorder("<"), count=2, offset=pos)
    values, counts, pos = _decode_table(body, pos + 2 * dtype.itemsize, nsym, dtype)
    streams = []
    for length in (unary_len, rem_len, e_unary_len, e_rem_len, (n - n_exc + 7) // 8):
        streams.append(body[pos:pos + length])
        pos += length
    changed = _positions(streams[0], streams[1], k, n, target.size, "a paired chunk names an element")
    places = _positions(streams[2], streams[3], ek, n_exc, n, "a paired chunk names an exception")
    if len(streams[4]) * 8 < n - n_exc:
        raise ValueError("a paired chunk's selector stream is short")
    # pair[0] + bit * (pair[1] - pair[0]) in wrapping integers: ~7x faster than pair[bits]
    diffs = np.unpackbits(np.frombuffer(streams[4], dtype=np.uint8), count=n - n_exc).astype(dtype)
    diffs *= pair[1:] - pair[:1]
    diffs += pair[:1]
    if n_exc:
        full = np.empty(n, dtype=dtype)
        keep = np.ones(n, dtype=bool)
        np.put(keep, places, False)
        full[keep] = diffs
        np.put(full, places, _decode_symbols(body, pos, values, counts, nwords, n_exc))
        diffs = full
    return changed, diffs


def sparse_changes(body: memoryview, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions, new − old differences) a SPARSE payload's body (after the kind byte) names
    in a chunk of ``target``'s size and dtype; the caller applies them (and can undo them)."""
    k, n, unary_len, rem_len, nsym, nwords = SPARSE_HEADER.unpack_from(body)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, target.dtype)
    values, counts, pos = _decode_table(body, SPARSE_HEADER.size, nsym, target.dtype)
    unary = body[pos:pos + unary_len]
    remainders = body[pos + unary_len:pos + unary_len + rem_len]
    pos += unary_len + rem_len
    changed = rice_positions(unary, remainders, k, n)
    if int(changed[-1]) >= target.size:
        raise ValueError("sparse chunk names an element past the chunk's end")
    return changed, _decode_symbols(body, pos, values, counts, nwords, n)


def _decode_dense(body: memoryview, target: np.ndarray) -> None:
    nsym, nwords = DENSE_HEADER.unpack_from(body)
    values, counts, pos = _decode_table(body, DENSE_HEADER.size, nsym, target.dtype)
    target += _decode_symbols(body, pos, values, counts, nwords, target.size)


def _decode_table(body: memoryview, pos: int, nsym: int, dtype) -> tuple[np.ndarray, np.ndarray, int]:
    values = np.frombuffer(body, dtype=dtype.newbyteorder("<"), count=nsym, offset=pos)
    pos += nsym * dtype.itemsize
    counts = np.frombuffer(body, dtype="<u4", count=nsym, offset=pos)
    return values, counts, pos + nsym * 4


def _decode_symbols(body: memoryview, pos: int, values: np.ndarray, counts: np.ndarray, nwords: int,
                    n: int) -> np.ndarray:
    """n values drawn from the table by the ANS stream at ``pos`` (a one-value table needs none)."""
    if values.size == 1:
        return np.full(n, values[0], dtype=values.dtype)
    words = np.frombuffer(body, dtype="<u4", count=nwords, offset=pos).astype(np.uint32)
    return values[ans_decode(words, counts, n)]


# ── Rice coding of gaps ───────────────────────────────────────────────────────────────────────────
# Rice coding of the gaps between changed elements, vectorised with numpy.
#
# Why by hand: no library on the index codes a geometric source with numpy-speed vectorised
# encode/decode. Gaps between changes of an update that touches a fraction p of the elements are
# close to geometric, and a Rice code with the best parameter k comes within ~1% of n·H(p) bits.
# The unary quotients and the k-bit remainders go to two separate streams so both decode without
# a bit-serial loop: quotients are the runs of 1s between the 0s of the unary stream.

def best_rice_parameter(gaps: np.ndarray) -> int:
    """The k in 0..62 that codes ``gaps`` in the fewest bits (searched near log2 of the mean)."""
    if gaps.size == 0:
        return 0
    guess = int(np.log2(max(float(gaps.mean()) * 0.69, 1.0)))
    costs = {k: gaps.size * (k + 1) + int((gaps >> np.uint64(k)).sum())
             for k in range(max(0, guess - 2), min(62, guess + 3))}
    return min(costs, key=costs.get)


def rice_encode(gaps: np.ndarray, k: int) -> tuple[bytes, bytes]:
    """(unary stream, remainder stream) for ``gaps`` (uint64)."""
    quotients = (gaps >> np.uint64(k)).astype(np.int64)
    ends = np.cumsum(quotients + 1) - 1  # position of each quotient's terminating 0
    unary = np.ones(int(ends[-1]) + 1 if ends.size else 0, dtype=np.uint8)
    unary[ends] = 0
    return np.packbits(unary).tobytes(), pack_fixed_width(gaps & np.uint64((1 << k) - 1), k)


def rice_decode(unary: bytes, remainders: bytes, k: int, n: int) -> np.ndarray:
    ends = np.flatnonzero(np.unpackbits(~np.frombuffer(unary, dtype=np.uint8)).view(bool))[:n]
    if ends.size != n:
        raise ValueError(f"unary stream holds {ends.size} quotients, expected {n}")
    quotients = np.diff(ends, prepend=-1) - 1
    return (quotients.astype(np.uint64) << np.uint64(k)) | unpack_fixed_width(remainders, k, n)


def rice_positions(unary, remainders, k: int, n: int) -> np.ndarray:
    """The n positions (int64, strictly increasing) whose gaps ``rice_encode`` coded: position i
    is sum over j <= i of (gap_j + 1), minus 1. Computed without materialising the gaps: the sum
    of the first i+1 quotients is ends_i - i (ends: the terminating 0s of the unary stream), so
    position i = ((ends_i - i) << k) + cumsum(remainders)_i + i. Fewer full passes than decoding
    then summing the gaps; decoding positions is most of what a sparse chunk costs the puller."""
    if n == 0:
        return np.zeros(0, np.int64)
    # nonzero over a bool view is ~5x faster than over uint8 (numpy's bool fast path)
    ends = np.flatnonzero(np.unpackbits(~np.frombuffer(unary, dtype=np.uint8)).view(bool))[:n]
    if ends.size != n:
        raise ValueError(f"unary stream holds {ends.size} quotients, expected {n}")
    index = np.arange(n, dtype=np.int64)
    ends -= index
    ends <<= k
    ends += index
    if k:
        ends += np.cumsum(unpack_fixed_width(remainders, k, n).view(np.int64))
    return ends


def pack_fixed_width(values: np.ndarray, k: int) -> bytes:
    """``values`` (uint64, each < 2**k) as k bits each, most significant bit first."""
    if k == 0 or values.size == 0:
        return b""
    shifts = np.arange(k - 1, -1, -1, dtype=np.uint64)
    matrix = ((values[:, None] >> shifts) & np.uint64(1)).astype(np.uint8)
    return np.packbits(matrix.ravel()).tobytes()


WINDOW_BITS = 57
"""Widest k the windowed unpack handles: a k-bit field starting at any bit of a byte lies
within the 8 bytes from that byte when k <= 64 - 7."""


def unpack_fixed_width(data: bytes, k: int, n: int) -> np.ndarray:
    """The n k-bit values ``pack_fixed_width`` wrote. Each value is cut out of the 64-bit
    big-endian word that starts at its first byte (read little-endian, then byte-swapped): the words are an overlapping view of the
    stream (byte stride 1), so this costs one gather and two shifts per value instead of an
    n x k bit matrix."""
    if k == 0 or n == 0:
        return np.zeros(n, dtype=np.uint64)
    if len(data) * 8 < n * k:
        raise ValueError(f"remainder stream holds {len(data) * 8} bits, expected {n * k}")
    if k > WINDOW_BITS:
        bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), count=n * k).reshape(n, k)
        weights = np.uint64(1) << np.arange(k - 1, -1, -1, dtype=np.uint64)
        return (bits.astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
    padded = np.zeros(len(data) + 8, dtype=np.uint8)
    padded[:len(data)] = np.frombuffer(data, dtype=np.uint8)
    words = np.ndarray(shape=(len(data),), dtype="<u8", buffer=padded, strides=(1,))
    offsets = np.arange(0, n * k, k, dtype=np.int64)
    first = np.take(words, offsets >> 3)  # take, native order: ~2x a big-endian fancy index
    first.byteswap(inplace=True)
    offsets &= 7
    first <<= offsets.view(np.uint64)
    first >>= np.uint64(64 - k)
    return first


# ── rANS of symbol streams ────────────────────────────────────────────────────────────────────────
# Entropy coding of symbol streams with an empirical (per-chunk) table, by rANS (constriction).
#
# The table is the sorted distinct values with their counts; the decoder rebuilds the identical
# probability model from it, so what is coded is the order-0 empirical entropy plus the table.

Categorical = constriction.stream.model.Categorical
AnsCoder = constriction.stream.stack.AnsCoder


def _model(counts: np.ndarray) -> Categorical:
    probabilities = counts.astype(np.float64) / float(counts.sum())
    return Categorical(probabilities, perfect=False)


def ans_encode(symbols: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``symbols`` (indices into ``counts``) -> compressed uint32 words. Needs len(counts) >= 2."""
    coder = AnsCoder()
    coder.encode_reverse(symbols.astype(np.int32, copy=False), _model(counts))
    return coder.get_compressed()


def ans_decode(words: np.ndarray, counts: np.ndarray, n: int) -> np.ndarray:
    coder = AnsCoder(words)
    return coder.decode(_model(counts), n)


# ── The entropy bound ─────────────────────────────────────────────────────────────────────────────
# The order-0 entropy bound of one update's change pattern (the yardstick of the codec).
#
# Per tensor of n elements of which c changed (p = c/n): n·H(p) bits to say which changed, plus
# c times the empirical entropy of the changed elements' new − old bit-pattern differences (as
# integers of the element's width). Summed over tensors, in bytes.

def binary_entropy_bits(p: float) -> float:
    if p <= 0.0 or p >= 1.0:
        return 0.0
    return float(-p * np.log2(p) - (1 - p) * np.log2(1 - p))


def empirical_entropy_bits(values: np.ndarray) -> float:
    """Total bits (count × entropy) of ``values`` under their own empirical distribution."""
    if values.size == 0:
        return 0.0
    _, counts = np.unique(values, return_counts=True)
    probs = counts / values.size
    return float(-(counts * np.log2(probs)).sum())


def tensor_bound_bits(old: np.ndarray, new: np.ndarray) -> tuple[float, int]:
    """(bound in bits, changed elements) for one tensor's bit patterns."""
    changed = np.flatnonzero(old != new)
    n = old.size
    bits = n * binary_entropy_bits(changed.size / n) if n else 0.0
    return bits + empirical_entropy_bits(new[changed] - old[changed]), int(changed.size)
