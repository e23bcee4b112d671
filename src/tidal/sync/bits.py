"""Rice coding of the gaps between changed elements, vectorised with numpy.

Why by hand: no library on the index codes a geometric source with numpy-speed vectorised
encode/decode. Gaps between changes of an update that touches a fraction p of the elements are
close to geometric, and a Rice code with the best parameter k comes within ~1% of n·H(p) bits.
The unary quotients and the k-bit remainders go to two separate streams so both decode without
a bit-serial loop: quotients are the runs of 1s between the 0s of the unary stream.
"""

from __future__ import annotations

import numpy as np


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
