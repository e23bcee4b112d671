"""The fleet's remote pools as a run sees them (orchestrator.pool.RemotePools): `tidal train`
passes ``RemoteFleet`` to the RL loop, which makes one when a recipe places a pool "remote"."""

from __future__ import annotations

from pathlib import Path

from tidal.fleet.auth import fleet_token
from tidal.fleet.coordinator import Coordinator
from tidal.fleet.remote import RemotePool


class RemoteFleet:
    """One coordinator (the HTTP endpoint workers join with ``tidal worker --join``) for all of
    a run's remote pools."""

    def __init__(self, cfg, run_dir: Path, weights_address: str, init_checkpoint: str,
                 latest_version):
        self.lease_s = cfg.fleet.lease_s
        self.coordinator = Coordinator(cfg, run_dir, fleet_token(run_dir=run_dir), weights_address,
                                       init_checkpoint, latest_version)

    def pool(self, cfg, ids, t0: float) -> RemotePool:
        pool = RemotePool(cfg, ids, self.lease_s)
        self.coordinator.add_pool(pool)
        return pool

    def start(self) -> None:
        self.coordinator.start()

    def stop(self) -> None:
        self.coordinator.stop()

    def summary(self) -> dict:
        return self.coordinator.summary()
