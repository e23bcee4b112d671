"""The whole online loop on this CPU: simulated users -> feedback -> learner -> gate -> canary ->
promoted versions, and what the gate and the canary do with a worse and a hacking candidate.

    cycle:  users run against `tidal serve` (learner on) until three versions were promoted
            (or the budget ran out); cycle_s = first feedback -> first promotion; the honest
            users' accept rate under the initial version and under each promoted one
    bad:    the same run restarted with the learner off (the controller still gates and watches
            canaries); a worse candidate (seeded noise on the live weights) and a hacking one
            (trained on what hacker users rewarded: questions or broken tool calls) are each
            registered twice: once through the gate, once straight into a canary with the gate
            skipped by hand, so both lines of defence are tried on their own
"""

from __future__ import annotations

import asyncio
import threading
import time

import torch

from tidal.bench.online_users import UserTraffic
from tidal.online.records import VersionRecord


def wait_for(records, predicate, timeout_s: float, poll_s: float = 1.0):
    """Poll ``records()`` (the registry's versions) until ``predicate(them)`` is truthy."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        records_now = records()
        hit = predicate(records_now)
        if hit:
            return hit
        time.sleep(poll_s)
    return None


class Traffic:
    """UserTraffic on a background thread (its own event loop) until ``stop()``."""

    def __init__(self, traffic: UserTraffic, concurrency: int):
        self.traffic = traffic
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=lambda: asyncio.run(traffic.run(concurrency, self._stop.is_set)), daemon=True)

    def __enter__(self) -> UserTraffic:
        self._thread.start()
        return self.traffic

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=180)


def promotions(records: list[VersionRecord]) -> list[VersionRecord]:
    """Versions promoted by a canary decision, in the order they were decided."""
    done = [r for r in records if r.canary.get("decision") == "promote"]
    return sorted(done, key=lambda r: r.canary.get("decided", 0))


def cycle_result(traffic: UserTraffic, records: list[VersionRecord], initial: int) -> dict:
    promoted = promotions(records)
    rates = {initial: traffic.accept_rate(initial)}
    for r in promoted[:3]:
        rates[r.version] = traffic.accept_rate(r.version)
    first = promoted[0].canary.get("decided") if promoted else None
    cycle_s = (first - traffic.first_feedback) if first and traffic.first_feedback else None
    gain = None
    if len(promoted) >= 1:
        last = promoted[min(2, len(promoted) - 1)].version
        gain = rates[last][0] - rates[initial][0]
    return {
        "cycle_s": cycle_s,
        "promoted_versions": [r.version for r in promoted],
        "accept_rate_by_version": {str(v): {"accept_rate": a, "responses": n}
                                   for v, (a, n) in rates.items()},
        "accept_rate_gain": gain,
        "accept_rate_gain_over": len(promoted[:3]),
        "feedback_events": len(traffic.log),
        "versions": [{"version": r.version, "parent": r.parent, "status": r.status,
                      "gate_passed": r.gate.get("passed"), "canary": r.canary.get("decision")}
                     for r in records],
    }


def register_bad(store, registry, weights_root, model, dtype: str, note: str, through_gate: bool,
                 share: float) -> int:
    """Publish ``model`` as a new candidate on top of the live version; through the gate, or
    straight into a canary with the gate skipped by hand."""
    from tidal.online.version_sync import publish_model

    live = registry.live()
    version = max(r.version for r in registry.all()) + 1000
    digest = publish_model(model, weights_root, version, dtype)
    gate = {} if through_gate else {"verdict": "skipped",
                                    "reason": "by hand (benchmark: the canary on its own)"}
    registry.register(VersionRecord(version=version, parent=live.version, manifest_sha256=digest,
                                    status="candidate", created=time.time(),
                                    weights=str(weights_root), gate=gate, note=note))
    if not through_gate:
        registry.start_canary(version, share)
        registry.update(version, canary={"started_seq": store.max_feedback_seq(),
                                         "started": time.time()})
    return version


def outcome_of(record: VersionRecord | None) -> dict:
    if record is None:
        return {"status": "undecided", "blocked": False}
    return {"status": record.status, "gate_passed": record.gate.get("passed"),
            "canary_decision": record.canary.get("decision"),
            "canary_reason": record.canary.get("reason"),
            "blocked": record.status in ("blocked", "rolled_back")}


def final_status(records, version: int, timeout_s: float) -> VersionRecord | None:
    def decided(records):
        for r in records:
            if r.version == version and r.status in ("blocked", "rolled_back", "live", "retired"):
                return r
        return None
    return wait_for(records, decided, timeout_s)


def load_live_model(loader, registry) -> torch.nn.Module:
    live = registry.live()
    return loader.load(live.version, live.manifest_sha256, "float32")
