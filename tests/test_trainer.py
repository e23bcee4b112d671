"""Trainer step semantics (micro-batching, masters, replay, learning direction) and checkpoints."""

import errno

import pytest
import torch

from tidal.model import ModelConfig, build_model
from tidal.trainer import checkpoint as ckpt_mod
from tidal.trainer.checkpoint import (
    TrainerCheckpointError,
    capture_rng_state,
    checkpoint_path,
    latest_checkpoint,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from tidal.trainer.config import TrainerConfig
from tidal.trainer.grpo import collate, token_logprobs
from tidal.trainer.trainer import Trainer
from tidal.trajectory import Batch, Segment, Trajectory

TINY = dict(vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64)


def tiny_model(seed=0, **over):
    return build_model(ModelConfig(**{**TINY, **over}), seed=seed)


def on_policy_batch(model, seed=0, groups=3, group_size=4, with_experts=False, env_token=True):
    """Trajectories whose recorded logprobs are the model's own (T = 1), rewards from a seed."""
    g = torch.Generator().manual_seed(seed)
    trajs = []
    for gid in range(groups):
        prompt = torch.randint(0, 256, (3 + gid,), generator=g).tolist()
        for _ in range(group_size):
            completion = torch.randint(0, 256, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist()
            mask = [1] * len(completion)
            if env_token:
                mask[-1] = 0  # the environment wrote the last token
            ids = torch.tensor([prompt + completion])
            with torch.no_grad():
                logits, experts = model(ids[:, :-1], return_experts=True)
            lp = token_logprobs(logits, ids[:, 1:], 1.0)[0, len(prompt) - 1:].tolist()
            ex = experts[0, len(prompt) - 1:].tolist() if with_experts else None
            seg = Segment(prompt, completion, [x * m for x, m in zip(lp, mask)],
                          [0 if m else -1 for m in mask], mask, ex)
            reward = float(torch.rand(1, generator=g) > 0.5)
            trajs.append(Trajectory(f"task{gid}", gid, [seg], reward=reward))
    return Batch(trajs, trainer_version=0)


def params_of(model):
    return [p.detach().clone() for p in model.parameters()]

# ---------------------------------------------------------------- step


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean"])
def test_micro_batching_gives_the_same_gradient_as_one_big_batch(agg):
    results = []
    for mbs in (64, 5):
        model = tiny_model()
        batch = on_policy_batch(model)
        tr = Trainer(model, TrainerConfig(micro_batch_size=mbs, loss_agg=agg, warmup_steps=0, lr=1e-2))
        batch.trajectories[0].reward = 5.0  # uneven advantages
        stats = tr.accumulate_gradients(collate(batch.trajectories, 0))
        results.append(([m.grad.clone() for m in tr.masters], stats))
    (g_big, s_big), (g_small, s_small) = results
    for a, b in zip(g_big, g_small):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-4)
    assert s_big.loss == pytest.approx(s_small.loss, abs=1e-6)
    assert s_big.tokens == s_small.tokens


def test_on_policy_step_metrics():
    model = tiny_model()
    batch = on_policy_batch(model)
    tr = Trainer(model, TrainerConfig(warmup_steps=4, lr=1e-3))
    m = tr.step(batch)
    assert tr.version == 1
    assert m.kl == pytest.approx(0.0, abs=1e-6)
    assert m.ratio_max == pytest.approx(1.0, abs=1e-4) and m.clip_frac == 0.0
    assert m.lr == pytest.approx(1e-3 / 4)
    assert m.tokens == sum(t.num_generated_tokens for t in batch.trajectories)
    assert m.grad_norm > 0 and m.entropy > 0
    expected = {"loss", "pg_loss", "kl", "clip_frac", "grad_norm", "lr", "tokens", "adv_mean",
                "ratio_max", "step_time_s"}
    assert expected <= m.to_json().keys()
    assert tr.step(batch).lr == pytest.approx(2e-3 / 4)


def test_policy_moves_toward_rewarded_completion():
    model = tiny_model()
    prompt, good, bad = [1, 2, 3], [40, 41, 42], [50, 51, 52]

    def logp(completion):
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            return token_logprobs(model(ids[:, :-1]), ids[:, 1:], 1.0)[0, 2:].sum().item()

    def traj(completion, reward):
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            lp = token_logprobs(model(ids[:, :-1]), ids[:, 1:], 1.0)[0, 2:].tolist()
        return Trajectory("t", 0, [Segment(prompt, completion, lp, [0] * 3, [1] * 3)], reward=reward)

    before_good, before_bad = logp(good), logp(bad)
    tr = Trainer(model, TrainerConfig(warmup_steps=0, lr=3e-3))
    for _ in range(3):
        tr.step(Batch([traj(good, 1.0), traj(bad, 0.0)], tr.version))
    assert logp(good) > before_good + 0.5
    assert logp(bad) < before_bad - 0.5


def test_environment_tokens_get_no_gradient():
    model = tiny_model()
    seg = Segment([1, 2], [3, 4], [0.0, 0.0], [-1, -1], [0, 0])
    batch = Batch([Trajectory("t", 0, [seg], reward=1.0), Trajectory("t", 0, [seg], reward=0.0)], 0)
    before = params_of(model)
    m = Trainer(model, TrainerConfig(warmup_steps=0)).step(batch)
    assert m.tokens == 0 and m.grad_norm == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, params_of(model)))


def test_bf16_parameters_train_through_fp32_masters():
    model = tiny_model(dtype="bfloat16")
    batch = on_policy_batch(model)
    tr = Trainer(model, TrainerConfig(warmup_steps=0, lr=1e-5))
    assert tr.separate_masters and all(m.dtype == torch.float32 for m in tr.masters)
    before = [m.clone() for m in tr.masters]
    tr.step(batch)
    # an update of ~1e-5 is far below bf16 resolution, yet the masters move
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.masters))
    for p, m in zip(tr.params, tr.masters):
        assert p.dtype == torch.bfloat16 and torch.equal(p, m.to(torch.bfloat16))
    state = tr.optimizer.state[tr.masters[0]]
    assert state["exp_avg"].dtype == torch.float32


def test_moe_trainer_replays_recorded_experts(monkeypatch):
    model = tiny_model(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
    batch = on_policy_batch(model, with_experts=True, groups=1, group_size=2)
    seg = batch.trajectories[0].segments[0]
    # Swap the recorded experts of the first completion token: replay must route through them.
    seg.experts[0] = [[(e + 1) % 4 for e in layer] for layer in seg.experts[0]]
    seen = []
    forward = model.forward

    def spy(*args, **kw):
        if kw.get("replay_experts") is not None:
            seen.append(kw["replay_experts"].clone())
        return forward(*args, **kw)

    monkeypatch.setattr(model, "forward", spy)
    m = Trainer(model, TrainerConfig(warmup_steps=0)).step(batch)
    assert len(seen) == 1
    P = len(seg.prompt_ids)
    assert seen[0][0, P - 1].tolist() == seg.experts[0]
    # prompt positions carry the model's own routing (valid ids), so the replayed run's logprob
    # of token 0 differs from the recorded one (kl > 0) only because of the swapped experts
    assert m.kl > 0
    assert int(seen[0].min()) >= 0


def test_moe_replay_of_own_routing_is_on_policy():
    model = tiny_model(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
    batch = on_policy_batch(model, with_experts=True, groups=2, group_size=2)
    m = Trainer(model, TrainerConfig(warmup_steps=0)).step(batch)
    assert m.kl == pytest.approx(0.0, abs=1e-6)


# ---------------------------------------------------------------- checkpoints


def batches(seed):
    ref = tiny_model(seed=123)
    return [on_policy_batch(ref, seed=seed + i) for i in range(4)]


def test_resume_from_checkpoint_is_bitwise_identical(tmp_path):
    cfg = TrainerConfig(warmup_steps=3, lr=1e-2, micro_batch_size=4)
    data = batches(0)
    model = tiny_model(seed=1)
    tr = Trainer(model, cfg)
    for b in data[:2]:
        tr.step(b)
    torch.manual_seed(7)
    rng = capture_rng_state()
    path = save_checkpoint(tr, checkpoint_path(tmp_path, tr.version), {"data_pos": 2, "rng": rng})
    assert path.name == "step_000002" and latest_checkpoint(tmp_path) == path
    for b in data[2:]:
        tr.step(b)
    expected = params_of(model)

    fresh = tiny_model(seed=99)
    tr2 = Trainer(fresh, cfg)
    extra = load_checkpoint(latest_checkpoint(tmp_path), tr2)
    assert tr2.version == 2 and extra["data_pos"] == 2
    torch.manual_seed(0)
    restore_rng_state(extra["rng"])
    assert torch.equal(torch.get_rng_state(), rng["torch"])
    for b in data[extra["data_pos"]:]:
        tr2.step(b)
    assert all(torch.equal(a, b) for a, b in zip(expected, params_of(fresh)))


def test_bf16_resume_restores_fp32_masters(tmp_path):
    cfg = TrainerConfig(warmup_steps=0, lr=1e-4)
    data = batches(5)[:2]
    model = tiny_model(seed=1, dtype="bfloat16")
    tr = Trainer(model, cfg)
    tr.step(data[0])
    save_checkpoint(tr, checkpoint_path(tmp_path, 1))
    tr.step(data[1])
    tr2 = Trainer(tiny_model(seed=2, dtype="bfloat16"), cfg)
    load_checkpoint(latest_checkpoint(tmp_path), tr2)
    tr2.step(data[1])
    assert all(torch.equal(a, b) for a, b in zip(tr.masters, tr2.masters))


def test_failed_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    cfg = TrainerConfig(warmup_steps=0)
    data = batches(1)
    tr = Trainer(tiny_model(), cfg)
    tr.step(data[0])
    good = save_checkpoint(tr, checkpoint_path(tmp_path, tr.version), {"x": 1})
    tr.step(data[1])

    def disk_full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt_mod.torch, "save", disk_full)
    with pytest.raises(OSError, match="step_000002.*Earlier checkpoints are intact") as info:
        save_checkpoint(tr, checkpoint_path(tmp_path, tr.version))
    assert info.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert latest_checkpoint(tmp_path) == good
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000001"]
    tr2 = Trainer(tiny_model(seed=5), cfg)
    assert load_checkpoint(good, tr2) == {"x": 1} and tr2.version == 1


def test_incomplete_missing_corrupt_and_mismatched_checkpoints_are_refused(tmp_path):
    tr = Trainer(tiny_model(), TrainerConfig())
    with pytest.raises(TrainerCheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope", tr)
    path = save_checkpoint(tr, checkpoint_path(tmp_path, 3))
    # a newer folder without the marker is skipped by latest_checkpoint and refused by load
    partial = checkpoint_path(tmp_path, 9)
    partial.mkdir()
    assert latest_checkpoint(tmp_path) == path
    with pytest.raises(TrainerCheckpointError, match="incomplete"):
        load_checkpoint(partial, tr)
    other = Trainer(tiny_model(hidden_size=48), TrainerConfig())
    with pytest.raises(TrainerCheckpointError, match="different model architecture"):
        load_checkpoint(path, other)
    (path / "trainer_state.pt").write_bytes(b"not a torch file")
    with pytest.raises(TrainerCheckpointError, match="corrupt"):
        load_checkpoint(path, tr)


def test_saving_the_same_step_again_replaces_it(tmp_path):
    tr = Trainer(tiny_model(), TrainerConfig())
    p = save_checkpoint(tr, checkpoint_path(tmp_path, 0), {"n": 1})
    save_checkpoint(tr, p, {"n": 2})
    assert load_checkpoint(p, Trainer(tiny_model(), TrainerConfig())) == {"n": 2}
    assert [x.name for x in (tmp_path / "checkpoints").iterdir()] == ["step_000000"]
