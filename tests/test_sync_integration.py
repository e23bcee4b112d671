"""`tidal train`'s rollout workers get their weights through the delta transport, and a pool's
tensors hash exactly to the publisher's manifest after every update."""

import hashlib

import blake3
import torch
from test_orchestrator import cfg_with, ckpt  # noqa: F401  (the module-scoped checkpoint fixture)

from tidal.config import TidalConfig
from tidal.engine import Engine
from tidal.model import build_model, load_tokenizer
from tidal.model.checkpoint import to_hf_state_dict
from tidal.orchestrator.loop import run_rl
from tidal.orchestrator.worker import RolloutWorker
from tidal.sync.transport import HttpWeightPublisher, HttpWeightSource


def digest_of(t: torch.Tensor, hash: str) -> str:
    hasher = blake3.blake3() if hash == "blake3" else hashlib.sha256()
    hasher.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return hasher.hexdigest()


def engine_hashes_match_manifest(engine, manifest) -> bool:
    state = to_hf_state_dict(engine.model)
    return all(digest_of(state[t.name], manifest.hash) == t.digest for t in manifest.tensors)


def test_http_store_publishes_deltas_that_a_worker_loads_bit_exact(tmp_path):
    cfg = cfg_with("--model.dtype", "bfloat16", "--trainer.dtype", "bfloat16")
    master = build_model(cfg.model.model_copy(update={"dtype": "float32"}), seed=0)
    store = HttpWeightPublisher(tmp_path / "weights", cfg.sync, "bfloat16")
    try:
        store.publish(master, 0)
        source = HttpWeightSource(store.address, cfg.sync)
        engine = Engine(source.load(0, torch.bfloat16), load_tokenizer(None), cfg.engine, version=0)
        with torch.no_grad():
            for p in master.parameters():
                p.add_(torch.randn_like(p).sign() * 1e-5)
        store.publish(master, 1)
        assert source.latest_version() == 1  # its first ask always reaches the origin
        fetched = source.puller.bytes_fetched
        engine.load_weights(source.load(1, torch.bfloat16), 1)
        assert engine.version == 1 and source.puller.manifest.kind == "delta"
        assert engine_hashes_match_manifest(engine, source.puller.manifest)
        expected = to_hf_state_dict(master.to(torch.bfloat16))
        got = to_hf_state_dict(engine.model)
        assert all(torch.equal(got[k].view(torch.int16), v.view(torch.int16)) for k, v in expected.items())
        anchor = store.publisher.store.manifest(0, "anchor").data_bytes
        assert source.puller.bytes_fetched - fetched < anchor / 2
    finally:
        store.close()


class HashCheckingWorker(RolloutWorker):
    """Records, after each assignment, whether the engine's tensors hash to the manifest of the
    version it holds."""

    checks: list[bool] = []

    def rollout(self, assignment):
        result = super().rollout(assignment)
        manifest = self.store.puller.manifest
        if manifest is None:  # still on the initial checkpoint's weights (version 0)
            return result
        HashCheckingWorker.checks.append(manifest.version == self.engine.version
                                         and engine_hashes_match_manifest(self.engine, manifest))
        return result


def test_default_recipe_moves_weights_over_http_and_pools_match_the_manifest(tmp_path, ckpt):  # noqa: F811
    assert TidalConfig().sync.transport == "http"
    HashCheckingWorker.checks = []
    summary = run_rl(cfg_with("--orchestrator.steps", "3"), tmp_path, ckpt, progress=False,
                     worker_cls=HashCheckingWorker)
    assert summary.steps == 3
    assert HashCheckingWorker.checks and all(HashCheckingWorker.checks)
    assert (tmp_path / "weights" / "v00000003" / "delta" / "manifest.json").is_file()


def test_filesystem_transport_stays_selectable(tmp_path, ckpt):  # noqa: F811
    summary = run_rl(cfg_with("--orchestrator.steps", "2", "--sync.transport", "filesystem"), tmp_path,
                     ckpt, progress=False)
    assert summary.steps == 2 and (tmp_path / "weights" / "LATEST").read_text() == "2"
