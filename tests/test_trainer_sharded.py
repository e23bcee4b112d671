"""The FSDP2-sharded trainer against the single-process Trainer, on CPU with gloo.

What is compared, and why not bit for bit: the sharded step computes the same loss and gradient
(every rank normalises by the whole batch's units; FSDP sums, not averages, the gradients), but
each parameter's gradient is summed in another order (per rank over its rows, then across ranks
by the reduce-scatter) and the clipping norm is a sum of per-shard squares, so results agree to
float rounding. AdamW divides each gradient by its own running RMS, which turns a rounding-level
gradient difference on a near-zero gradient into a larger relative difference of that element's
update; hence each updated parameter tensor is compared by its relative L2 difference
||sharded - single|| / ||single|| (1e-5), losses and norms with 1e-5 relative (or 1e-7 absolute
for an on-policy loss that is ~0).
"""

import copy

import pytest
import torch
import transformers
from test_trainer import on_policy_batch, tiny_model

from tidal.model import from_pretrained
from tidal.parallel.config import ShardingConfig
from tidal.parallel.group import (
    RendezvousError,
    WorldSizeError,
    env_rendezvous,
    free_port,
    init_group,
)
from tidal.trainer.config import TrainerConfig
from tidal.trainer.sharded.checkpoint import check_checkpoint
from tidal.trainer.sharded.launch import ShardedTrainerHandle, make_trainer
from tidal.trainer.trainer import Trainer

MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
REL = 1e-5


def config():
    return TrainerConfig(micro_batch_size=4, warmup_steps=0, lr=1e-2, dtype="float32")


def shards(processes=1, **sharding):
    return ShardingConfig(processes=processes, timeout_s=240, **sharding)


def assert_same_step(ref_stats, ref_model, stats, model):
    assert stats.loss == pytest.approx(ref_stats.loss, rel=REL, abs=1e-7)
    assert stats.grad_norm == pytest.approx(ref_stats.grad_norm, rel=REL)
    assert stats.tokens == ref_stats.tokens and stats.sequences == ref_stats.sequences
    assert stats.mismatch.tokens == ref_stats.mismatch.tokens
    for (name, a), b in zip(ref_model.named_parameters(), model.parameters()):
        rel = ((a - b).norm() / a.norm()).item()
        assert rel <= REL, f"{name}: relative difference {rel:.2e}"


@pytest.mark.slow
def test_sharded_steps_and_resume_from_4_to_2_processes_equal_one_process(tmp_path):
    """4 processes: one step as one process's; saved; 2 processes (with activation checkpointing)
    resume it to the same next step.
    Also: the HF export loads in transformers and from_pretrained with the same logits."""
    ref_model = tiny_model()
    first, second = on_policy_batch(ref_model, seed=0), on_policy_batch(ref_model, seed=1)
    model = copy.deepcopy(ref_model)
    ref = Trainer(ref_model, config())
    ref1 = ref.step(first)
    handle = ShardedTrainerHandle(model, config(), shards(4), numerics="fast")
    try:
        assert_same_step(ref1, ref_model, handle.step(first), handle.model)
        assert handle.version == 1
        handle.save(tmp_path / "ckpt", extra={"data": 7})
        handle.export_hf(tmp_path / "hf")
    finally:
        handle.close()
    check_checkpoint(tmp_path / "ckpt")
    ids = torch.tensor([[1, 5, 9, 200, 3, 17]])
    with torch.no_grad():
        want = ref_model(ids)
        ours = from_pretrained(tmp_path / "hf", dtype="float32")(ids)
        theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()(ids).logits
    assert (ours - want).abs().max().item() <= 1e-4
    assert (theirs.float() - want).abs().max().item() <= 1e-4

    ref2 = ref.step(second)
    resumed = ShardedTrainerHandle(tiny_model(seed=5), config(), shards(2, activation_checkpointing=True),
                                   numerics="fast")  # recomputed activations: the same step
    try:
        assert resumed.load(tmp_path / "ckpt") == {"data": 7}
        assert resumed.version == 1
        assert_same_step(ref2, ref_model, resumed.step(second), resumed.model)
    finally:
        resumed.close()


@pytest.mark.slow
@pytest.mark.parametrize("numerics", ["deterministic"])
def test_sharded_moe_step_with_replay_equals_one_process(numerics):
    """The deterministic (fused) forward shards the root as one unit; replayed experts travel.
    The batch's 3 rows do not split over 2 processes: the short rank trains an untrained copy."""
    ref_model = tiny_model(**MOE)
    batch = on_policy_batch(ref_model, with_experts=True, groups=1, group_size=3)
    model = copy.deepcopy(ref_model)
    ref1 = Trainer(ref_model, config(), numerics=numerics).step(batch)
    handle = ShardedTrainerHandle(model, config(), shards(2), numerics=numerics)
    try:
        stats = handle.step(batch)
    finally:
        handle.close()
    assert_same_step(ref1, ref_model, stats, model)
    assert stats.routing.flip_rate == ref1.routing.flip_rate


def test_one_process_is_the_unsharded_trainer():
    assert type(make_trainer(tiny_model(), config())) is Trainer


def test_a_torchrun_world_size_other_than_the_configs_is_refused(monkeypatch):
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "3"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", str(free_port()))):
        monkeypatch.setenv(name, value)
    with pytest.raises(WorldSizeError, match="sharding.processes = 2"):
        make_trainer(tiny_model(), config(), shards(2, launcher="torchrun"))


def test_missing_rendezvous_is_a_clear_error(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RendezvousError, match="torchrun"):
        env_rendezvous()
    with pytest.raises(RendezvousError, match="could not meet"):  # nobody hosts rank 0: 2 s, no hang
        init_group(1, 2, "127.0.0.1", free_port(), timeout_s=2)
    with pytest.raises(RendezvousError, match="outside"):
        init_group(3, 2, "127.0.0.1", free_port())


def test_activation_checkpointing_needs_the_module_forward():
    from tidal.errors import UserError
    from tidal.parallel.shard import shard_model

    with pytest.raises(UserError, match="numerics"):
        shard_model(tiny_model(), ShardingConfig(activation_checkpointing=True), deterministic=True)


@pytest.mark.slow
def test_tidal_train_runs_and_resumes_with_a_sharded_trainer(tmp_path):
    """`tidal train`'s loop with sharding.processes = 2: trains, checkpoints (DCP), resumes."""
    from test_orchestrator import cfg_with, records

    from tidal.model import build_model, save_pretrained
    from tidal.orchestrator.loop import run_rl

    sharded = ("--sharding.processes", "2", "--sharding.timeout_s", "240",
               "--orchestrator.guard.policy", "stop")  # restore: single-process trainer only
    init = tmp_path / "init"
    save_pretrained(build_model(cfg_with().model, seed=0), init)
    run_rl(cfg_with("--orchestrator.steps", "1", *sharded), tmp_path / "run", init, progress=False)
    summary = run_rl(cfg_with("--orchestrator.steps", "2", *sharded), tmp_path / "run", init,
                     progress=False, resume=True)
    assert summary.steps == 2
    assert [s["step"] for s in records(tmp_path / "run", "step")] == [1, 2]
    assert (tmp_path / "run" / "checkpoints" / "step_000002" / "dcp").is_dir()


def _child_peak(queue) -> None:
    from tidal.trainer.sharded.launch import peak_rss_bytes

    queue.put(peak_rss_bytes())


def test_each_process_measures_its_own_peak_memory():
    """A spawned rank's peak is its own, not its parent's (ru_maxrss is inherited), and a reset
    starts the peak again from what the process holds now."""
    import multiprocessing

    from tidal.trainer.sharded.launch import peak_rss_bytes, reset_peak_rss

    big = bytearray(400 << 20)  # 400 MiB touched in this process
    big[:: 4096] = b"x" * len(big[:: 4096])
    parent = peak_rss_bytes()
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_peak, args=(queue,))
    child.start()
    child_peak = queue.get(timeout=120)
    child.join()
    assert parent > 400 << 20 and child_peak < parent - (300 << 20)
    del big
    if reset_peak_rss():  # Linux with /proc: the peak follows what is held now
        assert peak_rss_bytes() < parent - (300 << 20)


@pytest.mark.slow
def test_a_correction_switched_on_mid_run_reaches_every_rank():
    """use_off_policy on the handle (what the run's guard does when deterministic numerics broke)
    changes every rank's loss: 2 processes then give one corrected process's loss (the loss is
    summed over the ranks). On these stale logprobs the corrected loss is ~0.07 and the
    uncorrected ~1.85, so a rank left uncorrected moves it far. Parameters are not compared: on
    an off-policy batch PPO's clip turns rounding into larger update differences."""
    from tidal.trainer.config import OffPolicyConfig

    ref_model = tiny_model()
    batch = on_policy_batch(ref_model, seed=3)
    for t in batch.trajectories:  # stale behaviour: logprobs 1.3x the model's
        t.segments[0].logprobs = [x * 1.3 for x in t.segments[0].logprobs]
    model = copy.deepcopy(ref_model)
    ref = Trainer(ref_model, config())
    ref.use_off_policy(OffPolicyConfig(kind="truncated_is"))
    ref_stats = ref.step(batch)
    handle = ShardedTrainerHandle(model, config(), shards(2), numerics="fast")
    try:
        handle.use_off_policy(OffPolicyConfig(kind="truncated_is"))
        stats = handle.step(batch)
    finally:
        handle.close()
    assert stats.off_policy is not None and handle.cfg.off_policy.kind == "truncated_is"
    assert stats.loss == pytest.approx(ref_stats.loss, rel=REL)
    assert stats.tokens == ref_stats.tokens
