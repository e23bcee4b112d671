"""The delta codec is bit-exact for every dtype and close to the order-0 entropy bound."""

import numpy as np
import pytest
import torch
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.sync.codec import (DENSE, PAIRED, RAW, SPARSE, XOR_ZSTD, best_rice_parameter, decode_chunk,
                              encode_chunk, pack_fixed_width, rice_decode, rice_encode, tensor_bound_bits,
                              unpack_fixed_width)
from tidal.sync.manifest import ChunkEntry, TensorEntry, WeightManifest, cheapest_path
from tidal.sync.tensors import bits_of

UINTS = [np.uint8, np.uint16, np.uint32, np.uint64]


def roundtrip(new, old):
    payload = encode_chunk(new, old)
    target = np.zeros_like(new) if old is None else old.copy()
    decode_chunk(payload, target)
    return payload, target


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(UINTS), st.integers(1, 3000), st.floats(0.0, 1.0), st.integers(0, 2**32 - 1))
def test_any_width_any_change_pattern_roundtrips_bit_exact(uint, n, fraction, seed):
    rng = np.random.default_rng(seed)
    info = np.iinfo(uint)
    old = rng.integers(0, info.max, size=n, dtype=uint, endpoint=True)
    new = old.copy()
    changed = rng.random(n) < fraction
    small = rng.integers(-3, 4, size=n).astype(np.int64).astype(uint)  # few ulps, wrapping
    wild = rng.integers(0, info.max, size=n, dtype=uint, endpoint=True)
    new[changed] = np.where(rng.random(n) < 0.9, old + small, wild)[changed]
    for base in (old, None):
        _, got = roundtrip(new, base)
        assert np.array_equal(got, new)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_special_float_bit_patterns_survive(dtype):
    """NaN payloads, -0.0, ±inf and subnormals, as bit patterns through a delta and an anchor."""
    finfo = torch.finfo(dtype)
    values = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), finfo.tiny / 4, -finfo.tiny / 8,
                           finfo.max, 1.0, -1.0], dtype=dtype)
    old = bits_of("x", values).bits
    width = old.dtype.itemsize * 8
    nan_payloads = np.array([(1 << width) - 1, (0x7FF << (width - 12)) | 5 if width == 64 else (1 << (width - 1)) - 3],
                            dtype=old.dtype)
    old = np.concatenate([old, nan_payloads])
    new = old.copy()
    new[[1, 4, 9, 10]] ^= old.dtype.type(1)  # -0.0 -> smallest negative subnormal, NaN payload bits
    for base in (old, None):
        _, got = roundtrip(new, base)
        assert got.tobytes() == new.tobytes()
    as_tensor = torch.from_numpy(got).view(dtype)
    assert torch.signbit(as_tensor[1]) and as_tensor[1] != 0  # was -0.0, now a negative subnormal
    assert torch.isnan(as_tensor[-2:]).all()
    assert bits_of("x", as_tensor).bits.tobytes() == new.tobytes()


def rl_like_update(n=400_000, seed=0):
    """bf16 serving weights of fp32 masters moved by ~1e-6: few elements change, by ±1 ulp."""
    g = torch.Generator().manual_seed(seed)
    master = torch.randn(n, generator=g) * 0.02
    before = bits_of("w", master.to(torch.bfloat16)).bits
    master += torch.randn(n, generator=g).sign() * 3e-6
    return before, bits_of("w", master.to(torch.bfloat16)).bits


def test_sparse_update_is_near_the_entropy_bound_and_beats_xor_zstd():
    old, new = rl_like_update()
    payload, got = roundtrip(new, old)
    assert np.array_equal(got, new)
    assert payload[0] in (SPARSE, PAIRED)
    bound_bits, changed = tensor_bound_bits(old, new)
    assert 0 < changed < old.size * 0.2
    assert len(payload) <= 1.15 * bound_bits / 8
    xor_zstd = zstandard.ZstdCompressor(level=1).compress(np.bitwise_xor(new, old).tobytes())
    assert len(payload) * 1.5 <= len(xor_zstd)


def test_dense_small_changes_are_table_coded_near_the_bound():
    """A large step on a small model: most elements change, by a few units in the last place."""
    rng = np.random.default_rng(1)
    old = rng.integers(0, 2**16, size=50_000, dtype=np.uint16)
    new = old + rng.choice(np.array([0, 1, 65535, 2], dtype=np.uint16), size=old.size, p=[0.4, 0.3, 0.25, 0.05])
    payload, got = roundtrip(new, old)
    assert np.array_equal(got, new) and payload[0] == DENSE
    bound_bits, _ = tensor_bound_bits(old, new)
    assert len(payload) <= 1.05 * bound_bits / 8


def test_varied_dense_changes_fall_back_to_xor_zstd_or_raw_and_unchanged_is_tiny():
    rng = np.random.default_rng(1)
    old = rng.integers(0, 2**32, size=10_000, dtype=np.uint32)
    new = old ^ rng.integers(0, 2**12, size=old.size, dtype=np.uint32)
    payload, got = roundtrip(new, old)
    assert np.array_equal(got, new) and payload[0] in (XOR_ZSTD, RAW)
    assert len(encode_chunk(old, old)) < 40


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 2**40), max_size=300))
def test_rice_codes_any_gaps(gaps):
    gaps = np.array(gaps, dtype=np.uint64)
    k = best_rice_parameter(gaps)
    unary, rem = rice_encode(gaps, k)
    assert np.array_equal(rice_decode(unary, rem, k, gaps.size), gaps)


@pytest.mark.parametrize("k", [1, 3, 5, 7, 8, 9, 13, 16, 31, 56, 57, 58, 62])
def test_fixed_width_fields_unpack_at_every_bit_offset(k):
    """The windowed unpack reads each field from the word at its first byte: every start bit
    (0..7) and the stream's last bytes must come out exact, also above the window's width."""
    rng = np.random.default_rng(k)
    for n in (1, 7, 8, 9, 1001):
        values = rng.integers(0, 2**k, size=n, dtype=np.uint64)
        values[-1] = 2**k - 1  # all ones at the stream's end
        assert np.array_equal(unpack_fixed_width(pack_fixed_width(values, k), k, n), values)
    with pytest.raises(ValueError):
        unpack_fixed_width(pack_fixed_width(values, k)[:-1], k, n)


def test_manifest_rejects_chunks_that_do_not_tile_the_tensors():
    t = TensorEntry(name="w", dtype="bfloat16", shape=(4,), digest="0" * 64)
    good = [ChunkEntry(tensor=0, start=0, count=2, offset=0, length=3, xxh3="0"),
            ChunkEntry(tensor=0, start=2, count=2, offset=3, length=3, xxh3="0")]
    WeightManifest(version=1, kind="anchor", tensors=[t], chunks=good, data_bytes=6)
    overlapping = [good[0], good[1].model_copy(update={"start": 1})]
    with pytest.raises(ValueError):
        WeightManifest(version=1, kind="anchor", tensors=[t], chunks=overlapping, data_bytes=6)
    with pytest.raises(ValueError):
        WeightManifest(version=1, kind="delta", tensors=[t], chunks=good, data_bytes=6)


def form(v, kind, nbytes, base=None):
    return {"version": v, "kind": kind, "base_version": base, "data_bytes": nbytes}


def test_cheapest_path_chooses_between_delta_chain_and_anchor():
    forms = [form(0, "anchor", 100)] + [form(v, "delta", 10, v - 1) for v in range(1, 8)]
    forms.append(form(5, "anchor", 100))
    assert cheapest_path(forms, 7, held=4) == ([(5, "delta"), (6, "delta"), (7, "delta")], 30)
    assert cheapest_path(forms, 7, held=None) == ([(5, "anchor"), (6, "delta"), (7, "delta")], 120)
    heavy = [form(0, "anchor", 100)] + [form(v, "delta", 40, v - 1) for v in range(1, 8)] + [form(5, "anchor", 50)]
    assert cheapest_path(heavy, 7, held=1) == ([(5, "anchor"), (6, "delta"), (7, "delta")], 130)
    assert cheapest_path(forms, 7, held=4, avoid=frozenset({(5, "delta")}))[0][0] == (5, "anchor")
