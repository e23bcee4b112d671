"""The HTTP/delta weight transport of `tidal train`, behind the small interface of
tidal.sync.transport (``WeightPublisher`` on the driver, ``WeightSource`` in each rollout
worker), the same interface as the filesystem store.

    driver:  HttpWeightPublisher ── Publisher (deltas, anchors) ── origin on loopback (a thread)
    worker:  HttpWeightSource ── its own Puller ── verified tensors ── a model for Engine.load_weights
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from tidal.sync.config import SyncConfig
from tidal.sync.dtypes import serving_tensors
from tidal.sync.publisher import Publisher
from tidal.sync.puller import Puller
from tidal.sync.server import ServerThread, make_app
from tidal.sync.tensors import bits_of, cast_floats
from tidal.sync.transport import WeightPublisher, WeightSource

CONFIG_FILE = "config.json"


class HttpWeightPublisher(WeightPublisher):
    def __init__(self, root: str | Path, cfg: SyncConfig, dtype: str, host: str = "127.0.0.1"):
        """``dtype``: the serving dtype (the rollout engines' dtype; ``cfg.dtype_rules`` apply per
        tensor on top, as in `tidal sync publish`). The root starts empty: a
        run's workers are fresh, so earlier runs' versions are of no use to them."""
        shutil.rmtree(root, ignore_errors=True)
        self.dtype, self.rules = dtype, cfg.dtype_rules
        self.publisher = Publisher(root, cfg)
        self.server = ServerThread(make_app(self.publisher.store), host=host)

    @property
    def address(self) -> str:
        """The origin's URL."""
        return self.server.url

    def publish(self, model, version: int) -> None:
        from tidal.model.checkpoint import config_to_hf, to_hf_state_dict

        tensors = serving_tensors(to_hf_state_dict(model), self.dtype, self.rules)
        config = json.dumps(config_to_hf(model.config, self.dtype)).encode()
        self.publisher.publish([bits_of(k, v) for k, v in tensors.items()], {CONFIG_FILE: config},
                               version=version)

    def latest_version(self) -> int | None:
        return self.publisher.head_version

    def close(self) -> None:
        self.server.stop()


class HttpWeightSource(WeightSource):
    def __init__(self, address: str, cfg: SyncConfig):
        self.cfg = cfg
        self.puller = Puller([address], cfg)
        self._asked_at, self._latest = float("-inf"), None

    def latest_version(self) -> int | None:
        """The origin's newest version, asked at most every ``poll_interval_s`` (workers ask
        between decode steps)."""
        now = time.monotonic()
        if now - self._asked_at >= self.cfg.poll_interval_s:
            self._asked_at, self._latest = now, self.puller.latest()
        return self._latest

    def load(self, version: int, dtype):
        """Pull ``version`` (a delta from the one held, when cheaper) and wrap it as a model; the
        puller has checked every tensor's sha256 before this returns. The model's tensors are
        the puller's own arrays (no copy), which the next ``load`` changes in place: copy them
        out (Engine.load_weights does) before loading again, and never modify them."""
        from tidal.model.checkpoint import config_from_hf, model_from_hf_tensors

        self.puller.pull(version)
        dtype_name = str(dtype).removeprefix("torch.")
        cfg = config_from_hf(json.loads(self.puller.files[CONFIG_FILE]))
        cfg = cfg.model_copy(update={"dtype": dtype_name})
        tensors = {t.name: t.to_torch() for t in self.puller.tensors}
        return model_from_hf_tensors(cfg, cast_floats(tensors, dtype_name))
