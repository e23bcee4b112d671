"""The shared-prefix forward (model/shared_prefix.py) and the trainer's micro-batches over it
(trainer/shared_prefix.py): the same logits bit for bit as the full rows, the same training step."""

import pytest
import torch
from test_trainer import on_policy_batch, tiny_model

from tidal.model import ModelConfig, build_model
from tidal.model.shared_prefix import SharedPrefix
from tidal.trainer.config import TrainerConfig
from tidal.trainer.grpo import collate
from tidal.trainer.shared_prefix import micro_batches, prompt_groups
from tidal.trainer.trainer import Trainer

TINY = dict(vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=256)


def _rows(seed=0, prompt_lengths=(5, 9, 70), per_prompt=3):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 256, (n,), generator=g) for n in prompt_lengths]
    rows, owner = [], []
    for i, p in enumerate(prompts):
        for _ in range(per_prompt):
            c = torch.randint(0, 256, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g)
            rows.append(torch.cat([p, c]))
            owner.append(i)
    return prompts, rows, owner


def _padded(seqs, width=None):
    width = width or max(len(s) for s in seqs)
    out = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = s
    return out


@pytest.mark.parametrize("experts", [0, 4])
def test_suffix_logits_equal_the_full_rows_bit_for_bit(experts):
    model = build_model(ModelConfig(**TINY, num_experts=experts, moe_intermediate_size=32), seed=0)
    prompts, rows, owner = _rows()
    moe = experts > 0
    with torch.no_grad():
        full = model(_padded(rows), deterministic=True, return_experts=moe)
    full_logits, full_experts = full if moe else (full, None)
    lengths = torch.tensor([len(p) - 1 for p in prompts])
    prefix = SharedPrefix(_padded([p[:-1] for p in prompts]), lengths, torch.tensor(owner),
                          None if not moe else full_experts[[owner.index(i) for i in range(len(prompts))], :int(lengths.max())])
    suffixes = [r[int(lengths[o]):] for r, o in zip(rows, owner)]
    replay = None
    if moe:  # route the suffix through the experts the full forward chose there
        replay = torch.zeros(len(rows), max(len(s) for s in suffixes), *full_experts.shape[2:], dtype=torch.long)
        for b, (s, o) in enumerate(zip(suffixes, owner)):
            replay[b, :len(s)] = full_experts[b, int(lengths[o]):int(lengths[o]) + len(s)]
    with torch.no_grad():
        out = model(_padded(suffixes), prefix=prefix, replay_experts=replay, deterministic=True,
                    return_experts=moe)
    logits = out[0] if moe else out
    for b, (s, o) in enumerate(zip(suffixes, owner)):
        start = int(lengths[o])
        assert torch.equal(logits[b, :len(s)], full_logits[b, start:start + len(s)]), b


def test_the_prefix_gets_the_gradient_of_all_its_rows():
    model = build_model(ModelConfig(**TINY), seed=0)
    prompts, rows, owner = _rows(per_prompt=2)
    lengths = torch.tensor([len(p) - 1 for p in prompts])
    full = model(_padded(rows), deterministic=True)
    loss = sum(full[b, int(lengths[o]):len(r)].logsumexp(-1).sum() for b, (r, o) in enumerate(zip(rows, owner)))
    loss.backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    prefix = SharedPrefix(_padded([p[:-1] for p in prompts]), lengths, torch.tensor(owner))
    suffixes = [r[int(lengths[o]):] for r, o in zip(rows, owner)]
    out = model(_padded(suffixes), prefix=prefix, deterministic=True)
    loss = sum(out[b, :len(s)].logsumexp(-1).sum() for b, s in enumerate(suffixes))
    loss.backward()
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=1e-4, atol=1e-6)


def test_rows_group_by_prompt_and_micro_batches_hold_whole_groups():
    model = tiny_model()
    tb = collate(on_policy_batch(model, groups=3, group_size=4).trajectories, pad_id=0)
    groups = prompt_groups(tb, replay=False)
    assert sorted(len(g) for g in groups) == [4, 4, 4]
    mbs = micro_batches(tb, size=8, pad_id=0, replay=False)
    assert [len(v.lengths) for v, _ in mbs] == [8, 4]
    for view, prefix in mbs:
        assert prefix.ids.shape[0] == (2 if len(view.lengths) == 8 else 1)
        assert float(view.loss_mask.sum()) > 0
    trained = sum(float(v.loss_mask.sum()) for v, _ in mbs)
    assert trained == float(tb.loss_mask.sum())  # every trained token is in a suffix
    one_token = collate(on_policy_batch(model).trajectories, pad_id=0)
    one_token.prompt_lengths[0] = 1
    assert micro_batches(one_token, 8, 0, False) is None  # nothing to share: the plain path
    no_completion = collate(on_policy_batch(model).trajectories, pad_id=0)
    no_completion.lengths[0] = no_completion.prompt_lengths[0] - 1  # an episode skipped unanswered
    assert micro_batches(no_completion, 8, 0, False) is None


@pytest.mark.parametrize("moe", [False, True])
def test_a_step_with_shared_prompts_equals_the_plain_step(moe):
    over = dict(num_experts=4, moe_intermediate_size=32) if moe else {}
    results = {}
    for share in (True, False):
        model = tiny_model(**over)
        batch = on_policy_batch(model, groups=3, group_size=4, with_experts=moe)
        cfg = TrainerConfig(lr=1e-2, warmup_steps=0, micro_batch_size=5, share_prompts=share,
                            router_replay="if_available" if moe else "required")
        trainer = Trainer(model, cfg)
        results[share] = (trainer.step(batch), [p.detach().clone() for p in model.parameters()])
    (on, p_on), (off, p_off) = results[True], results[False]
    # the same logprobs bit for bit: the same mismatch against the recorded ones, to the last bit
    assert on.mismatch.bitwise_equal_fraction == off.mismatch.bitwise_equal_fraction
    assert on.mismatch.max_abs_logprob_diff == off.mismatch.max_abs_logprob_diff
    assert on.mismatch.tokens == off.mismatch.tokens > 0
    assert on.loss == pytest.approx(off.loss, abs=1e-6)  # on-policy: about -mean(A) = 0
    assert on.grad_norm == pytest.approx(off.grad_norm, rel=1e-4)
    assert on.entropy == pytest.approx(off.entropy, rel=1e-5)
    for a, b in zip(p_on, p_off):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
