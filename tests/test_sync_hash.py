"""Tensors are verified by the hash the manifest names (BLAKE3 for new versions, sha256 for old
manifests), a tampered byte is caught and undone, the PAIRED chunk kind is bit-exact, and the
delivery-time model adds up."""

from __future__ import annotations

import json

import blake3
import numpy as np
import pytest
import torch
from test_sync_transport import CFG, same, versions

from tidal.sync.client import apply_form
from tidal.sync.codec import PAIRED, SPARSE, decode_chunk, encode_chunk
from tidal.sync.errors import SyncError, VerificationError
from tidal.sync.manifest import WeightManifest
from tidal.sync.origin import Publisher, ServerThread, encode_form, make_app
from tidal.sync.pull import Puller, predict_delivery_s
from tidal.sync.tensors import bits_of


def copies(tensors):
    return [type(t)(t.name, t.dtype, t.shape, t.bits.copy(), t.file) for t in tensors]


def old_style(manifest: WeightManifest) -> WeightManifest:
    """The same manifest as a tidal version before BLAKE3 wrote it: no "hash", "sha256" keys."""
    data = json.loads(manifest.to_json())
    assert data.pop("hash") == "sha256"
    for t in data["tensors"]:
        t["sha256"] = t.pop("digest")
    return WeightManifest.from_json(json.dumps(data))


def test_the_manifest_names_blake3_and_its_digests_are_blake3_of_the_bytes():
    snaps = versions(1)
    manifest, _ = encode_form(snaps[0], None, CFG, 0, None, [])
    assert manifest.hash == "blake3" and json.loads(manifest.to_json())["hash"] == "blake3"
    for entry, t in zip(manifest.tensors, snaps[0]):
        assert entry.digest == blake3.blake3(t.bits.tobytes()).hexdigest()


@pytest.mark.parametrize("hash", ["blake3", "sha256"])
def test_a_tampered_byte_is_caught_and_the_base_is_left_as_it_was(hash):
    """One byte of a delta's payload changed (its xxh3 fixed, as a lying upstream would): the
    applied bytes no longer hash to the manifest, and the held arrays are the base again."""
    cfg = CFG.model_copy(update={"hash": hash})
    snaps = versions(2, seed=5)
    manifest, payloads = encode_form(snaps[1], snaps[0], cfg, 1, 0, [])
    i = next(i for i, p in enumerate(payloads) if p[0] in (SPARSE, PAIRED) and len(p) > 64)
    bad = bytearray(payloads[i])
    bad[-1] ^= 0x10  # an ANS word or a selector bit: decodes, to different values
    tampered = [*payloads[:i], bytes(bad), *payloads[i + 1:]]
    held = copies(snaps[0])
    with pytest.raises(VerificationError, match=hash):
        apply_form(manifest, tampered.__getitem__, held, 2, [t.digest(hash) for t in snaps[0]])
    assert same(held, snaps[0])
    assert same(apply_form(manifest, payloads.__getitem__, held, 2), snaps[1])


def test_an_anchor_with_a_tampered_byte_is_refused():
    snaps = versions(1)
    manifest, payloads = encode_form(snaps[0], None, CFG, 0, None, [])
    bad = [bytes([p[0]]) + bytes([p[1] ^ 1]) + p[2:] if k == 0 else p for k, p in enumerate(payloads)]
    with pytest.raises(VerificationError, match=manifest.tensors[manifest.chunks[0].tensor].name):
        apply_form(manifest, bad.__getitem__, None)


def test_an_old_sha256_manifest_still_verifies_and_still_catches_a_lie():
    snaps = versions(2, seed=2)
    manifest, payloads = encode_form(snaps[1], snaps[0], CFG.model_copy(update={"hash": "sha256"}), 1, 0, [])
    old = old_style(manifest)
    assert old.hash == "sha256" and old == manifest
    assert same(apply_form(old, payloads.__getitem__, copies(snaps[0])), snaps[1])
    lie = old.model_copy(update={"tensors": [old.tensors[0].model_copy(update={"digest": "0" * 64}),
                                             *old.tensors[1:]]})
    with pytest.raises(VerificationError, match="sha256"):
        apply_form(lie, payloads.__getitem__, copies(snaps[0]))


def test_a_manifest_naming_an_unknown_hash_is_refused_naming_the_field():
    manifest, _ = encode_form(versions(1)[0], None, CFG, 0, None, [])
    data = json.loads(manifest.to_json())
    data["hash"] = "md5"
    with pytest.raises(ValueError, match="hash"):
        WeightManifest.from_json(json.dumps(data))


def test_a_puller_holding_a_sha256_version_rehashes_everything_for_a_blake3_delta(tmp_path):
    """Held digests by another hash are not reused: every tensor of the new version is hashed
    by BLAKE3 (a tensor the delta did not touch would otherwise be compared across hashes)."""
    snaps = versions(2, seed=4)
    frozen = [snaps[1][0], snaps[0][1], snaps[1][2]]  # "b" unchanged
    Publisher(tmp_path / "o", CFG.model_copy(update={"hash": "sha256"})).publish(snaps[0])
    pub = Publisher(tmp_path / "o", CFG)
    (manifest,) = pub.publish(frozen)
    assert manifest.kind == "delta" and manifest.hash == "blake3"
    server = ServerThread(make_app(pub.store))
    puller = Puller([server.url], CFG)
    try:
        assert puller.pull(0) == 0 and puller.manifest.hash == "sha256"
        assert puller.pull(1) == 1
        assert same(puller.tensors, frozen) and puller.manifest.hash == "blake3"
        assert puller._digests == [t.digest("blake3") for t in frozen]
    finally:
        puller.close()
        server.stop()


def rl_update_with_tail(n=300_000, seed=0):
    """bf16 of fp32 masters moved by AdamW-sized steps: mostly ±1 ulp, some ±2..±4."""
    g = torch.Generator().manual_seed(seed)
    master = torch.randn(n, generator=g) * 0.02
    before = bits_of("w", master.to(torch.bfloat16)).bits
    master += torch.randn(n, generator=g) * 4e-6
    return before, bits_of("w", master.to(torch.bfloat16)).bits


def test_paired_chunks_are_bit_exact_and_near_the_sparse_size():
    from tidal.sync import codec

    old, new = rl_update_with_tail()
    paired = encode_chunk(new, old)
    assert paired[0] == PAIRED
    got = old.copy()
    decode_chunk(paired, got)
    assert np.array_equal(got, new)
    sparse_kinds = codec.PAIRED_SLACK
    codec.PAIRED_SLACK = -1.0  # what an older publisher wrote: SPARSE, which still decodes
    try:
        sparse = encode_chunk(new, old)
    finally:
        codec.PAIRED_SLACK = sparse_kinds
    assert sparse[0] == SPARSE and len(paired) <= (1 + codec.PAIRED_SLACK) * len(sparse)
    got = old.copy()
    decode_chunk(sparse, got)
    assert np.array_equal(got, new)


def test_a_truncated_paired_chunk_is_an_error_not_a_wrong_result():
    old, new = rl_update_with_tail(50_000, seed=1)
    paired = encode_chunk(new, old)
    assert paired[0] == PAIRED
    with pytest.raises(ValueError):
        decode_chunk(paired[:len(paired) // 2], old.copy())


def test_predicted_delivery_adds_latency_transfer_and_the_receivers_work():
    # 1.8 MB over 1 Gbit/s = 14.4 ms on the wire; 214 MB at 2 GB/s = 107 ms of receiving CPU
    one = predict_delivery_s(1.8e6, 214e6, 1e9, 0.025, 2e9)
    assert one == pytest.approx(0.025 + 0.107)
    # the wire dominates when the receiver is fast; a relay hop adds latency + transfer
    assert predict_delivery_s(1.8e6, 214e6, 1e9, 0.025, 1e12) == pytest.approx(0.025 + 0.0144)
    assert predict_delivery_s(1.8e6, 214e6, 1e9, 0.025, 2e9, hops=2) == pytest.approx(one + 0.025 + 0.0144)
    assert predict_delivery_s(1.8e6, 214e6, 1e9, 0.025, 2e9, subscribed=False) == pytest.approx(one + 0.025)
    for bad in ({"bandwidth_bps": 0}, {"latency_s": -1}, {"hops": 0}, {"decode_bytes_per_s": 0}):
        args = {"delta_bytes": 1.8e6, "full_bytes": 214e6, "bandwidth_bps": 1e9, "latency_s": 0.025,
                "decode_bytes_per_s": 2e9, **bad}
        with pytest.raises(SyncError, match=next(iter(bad))):
            predict_delivery_s(**args)
