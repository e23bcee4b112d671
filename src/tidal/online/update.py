"""Weights pushed by a training run: POST /v1/tidal/update_weights loads a version from the
run's weight transport and serves it live (a rollout worker's reload call, tidal.engine.remote).

    rollout worker ── update_weights {version, weights, transport} ──> WeightUpdater.update
        http: a Puller kept per origin (a delta against the version it holds; every tensor's
              hash checked against the manifest), the digest = weights_digest(manifest)
        filesystem: the run's folder v%08d (tidal.sync.transport), digest of its tensors
        ──> registry: registered and promoted live (so the registry poll keeps serving it)
        ──> PolicyServer.add_version (requests in flight finish on the version they started on)

A version the registry already holds under another digest is refused (``UpdateConflict``): one
version number never names two sets of weights. Run rollout servers with the learner off
(``--online.learner.enabled false``): the training run, not the server, makes their versions.
"""

from __future__ import annotations

import copy
import threading
import time

from tidal.errors import UserError
from tidal.online.records import VersionRecord
from tidal.online.version_sync import tensors_digest, weights_digest


class UpdateConflict(UserError):
    """The version is already registered here with other weights."""


class WeightUpdater:
    def __init__(self, policy, registry, dtype: str, sync_cfg):
        self.policy, self.registry, self.dtype, self.sync_cfg = policy, registry, dtype, sync_cfg
        self._sources: dict[str, object] = {}  # origin URL -> its HttpWeightSource (a Puller)
        self._lock = threading.Lock()

    def update(self, version: int, weights: str, transport: str) -> tuple[int, str]:
        """Serve ``version`` live (loading it unless it is held); returns (version, digest).
        One update at a time; blocking: call it from a worker thread."""
        with self._lock:
            held = self._held_sha(version)
            record = self.registry.get(version)
            if (held is not None and self.policy.live == version and record is not None
                    and record.weights == weights):
                return version, held  # asked again (another worker of the run): nothing to do
            model, sha = self._load(version, weights, transport)
            if record is not None and record.manifest_sha256 != sha:
                raise UpdateConflict(
                    f"version {version} is already registered on this server with digest "
                    f"{record.manifest_sha256} but {weights} holds digest {sha}; serve this "
                    "run's rollouts from a fresh --run-dir")
            with self.policy.refreshing:  # the registry poll must not switch back meanwhile
                if held is None:
                    self.policy.add_version(version, sha, model, "live")
                self._register_live(version, sha, weights, record)
                self.policy.set_live(version)
            return version, sha

    def _held_sha(self, version: int) -> str | None:
        try:
            return self.policy.sha_of(version)
        except KeyError:
            return None

    def _load(self, version: int, weights: str, transport: str):
        if transport == "http":
            from tidal.sync.transport import HttpWeightSource

            source = self._sources.get(weights)
            if source is None:
                source = self._sources[weights] = HttpWeightSource(weights, self.sync_cfg)
            # the model shares the puller's arrays, which the next pull changes in place
            model = copy.deepcopy(source.load(version, self.dtype))
            return model.eval(), weights_digest(source.puller.manifest)
        import torch

        from tidal.model.checkpoint import to_hf_state_dict
        from tidal.sync.tensors import bits_of
        from tidal.sync.transport import FilesystemWeightStore

        model = FilesystemWeightStore(weights).load(version, getattr(torch, self.dtype)).eval()
        bits = [bits_of(k, v) for k, v in to_hf_state_dict(model).items()]
        return model, tensors_digest(bits, self.sync_cfg.hash)

    def _register_live(self, version: int, sha: str, weights: str, record) -> None:
        if record is None:
            live = self.registry.live()
            self.registry.register(VersionRecord(
                version, live.version if live is not None else None, sha, "candidate", time.time(),
                weights=weights, gate={"verdict": "skipped", "reason": "pushed by a training run"},
                note=f"update_weights from {weights}"))
            record = self.registry.get(version)
        if record.status != "live":
            self.registry.promote(version, force=True, note=f"update_weights from {weights}")

    def close(self) -> None:
        for source in self._sources.values():
            source.puller.close()
