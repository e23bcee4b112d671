"""How long one update takes to reach a puller over a chain of links, from first principles, so a
simulator of a global deployment can give per-region delivery times without moving bytes.

    subscribed puller, h hops (origin -> relay -> ... -> puller), each one-way latency L, bandwidth B:

      relay hops (store and forward):   L + delta_bytes * 8 / B          each of the first h - 1
      last hop (decoded while it streams in):
                                        L + max(delta_bytes * 8 / B,  full_bytes / decode_bytes_per_s)
      + overhead_s                      (the origin noticing the version; ~2 ms, sync/server.py)

A subscriber's request is already waiting when the version appears, so the answer costs one
one-way latency; an ordinary (polled) pull first sends its request: ``subscribed=False`` counts
a whole round trip per hop. The receiving CPU's work (decode, apply in place, hash every applied
byte) is proportional to the model's bytes, not the delta's: it starts with the first byte and
runs beside the transfer, so the last hop costs the larger of the two. Relays forward a form's
bytes without decoding it. TCP slow start is not modelled (connections are kept open from one
pull to the next). ``decode_bytes_per_s`` is model bytes per wall second on the puller's cores
(decode + apply + hash together); `tidal bench sync` records it as
``receiver.receive_model_bytes_per_s`` beside the per-core figures.
"""

from __future__ import annotations

from tidal.sync.errors import SyncError


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise SyncError(f"predict_delivery_s: {name} must be > 0, got {value!r}")


def _non_negative(name: str, value: float) -> None:
    if not value >= 0:
        raise SyncError(f"predict_delivery_s: {name} must be >= 0, got {value!r}")


def predict_delivery_s(delta_bytes: float, full_bytes: float, bandwidth_bps: float, latency_s: float,
                       decode_bytes_per_s: float, hops: int = 1, *, subscribed: bool = True,
                       overhead_s: float = 0.0) -> float:
    """Seconds from publish to the update applied and verified at the end of ``hops`` links.

    delta_bytes: bytes on the wire (the form's data + manifest); full_bytes: the model's bytes
    (what the receiver decodes into and hashes); bandwidth_bps: bits per second of each link;
    latency_s: one-way latency of each link; decode_bytes_per_s: the receiver's model bytes per
    wall second (all its cores); hops: links in series (1 = puller at the origin's region).
    Raises SyncError naming a bad argument."""
    for name, value in (("delta_bytes", delta_bytes), ("full_bytes", full_bytes), ("latency_s", latency_s),
                        ("overhead_s", overhead_s)):
        _non_negative(name, value)
    _positive("bandwidth_bps", bandwidth_bps)
    _positive("decode_bytes_per_s", decode_bytes_per_s)
    if not isinstance(hops, int) or hops < 1:
        raise SyncError(f"predict_delivery_s: hops must be an integer >= 1, got {hops!r}")
    wire_s = delta_bytes * 8 / bandwidth_bps
    latency = latency_s if subscribed else 2 * latency_s
    relays = (hops - 1) * (latency + wire_s)
    return overhead_s + relays + latency + max(wire_s, full_bytes / decode_bytes_per_s)
