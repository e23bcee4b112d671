"""Mid-training sharded with FSDP2 over 2 processes (gloo, CPU) against the same run in one
process: the same losses step by step and the same saved weights, up to float summation order
(each rank sums its rows' gradients, then the reduce-scatter sums the ranks; the loss's token
count is all-reduced, so the objective is the single-process one). Compared to 1e-5 relative:
losses, and each saved tensor by its relative L2 difference (AdamW divides by each element's
RMS, which turns rounding on a near-zero gradient into a larger elementwise difference)."""

import json

import pytest
from test_pretrain import DOCS, tiny_cfg

from tidal.model import from_pretrained
from tidal.parallel.group import WorldSizeError
from tidal.pretrain.loop import pretrain
from tidal.pretrain.sharded import check_batch

REL = 1e-5


def sharded_cfg(tmp_path, processes, **pretrain_fields):
    cfg = tiny_cfg(tmp_path, max_steps=4, warmup_steps=1, log_every=1, **pretrain_fields)
    sharding = cfg.sharding.model_copy(update={"processes": processes, "timeout_s": 240})
    return cfg.model_copy(update={"sharding": sharding})


def losses(out):
    return [json.loads(x)["loss"] for x in (out / "pretrain_metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_processes_pretrain_as_one(tmp_path):
    one = pretrain(sharded_cfg(tmp_path, 1), tmp_path / "one", docs=DOCS, progress=False)
    two = pretrain(sharded_cfg(tmp_path, 2), tmp_path / "two", docs=DOCS, progress=False)
    assert two == tmp_path / "two" / "model"
    want, got = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert len(got) == len(want) == 4
    assert got == pytest.approx(want, rel=REL)
    a, b = from_pretrained(one, dtype="float32"), from_pretrained(two, dtype="float32")
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        rel = ((x - y).norm() / x.norm().clamp(min=1e-12)).item()
        assert rel <= REL, f"{name}: relative difference {rel:.2e}"


def test_a_batch_the_processes_cannot_split_is_one_clear_error(tmp_path):
    check_batch(sharded_cfg(tmp_path, 2, batch_size=8))
    with pytest.raises(WorldSizeError, match="pretrain.batch_size = 8 .* sharding.processes = 3"):
        check_batch(sharded_cfg(tmp_path, 3, batch_size=8))
    with pytest.raises(WorldSizeError, match="pretrain.batch_size"):
        pretrain(sharded_cfg(tmp_path, 3, batch_size=8), tmp_path / "out", docs=DOCS, progress=False)
    assert not (tmp_path / "out").exists()
