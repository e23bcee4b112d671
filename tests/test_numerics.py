"""Deterministic numerics: the engine's sampling logprobs equal the trainer's recomputation bit for
bit (any batch size, decode vs full forward, chunked prefill, dense and MoE, fp32 and bf16);
router replay; the batch-invariant ops themselves."""

import copy

import pytest
import torch

from tidal.config import TidalConfig
from tidal.engine.config import EngineConfig
from tidal.engine.engine import Engine
from tidal.engine.request import GenerationRequest
from tidal.model import KVCache, build_model, preset
from tidal.model.tokenizer import ByteTokenizer
from tidal.numerics.ops import (
    KEY_BLOCK, DeterministicLinear, attention, attention_bias, folded_rms_norm,
)
from tidal.trainer.config import TrainerConfig
from tidal.trainer.grpo import collate
from tidal.trainer.trainer import MissingExpertsError, Trainer
from tidal.trajectory import Segment, Trajectory


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    view = torch.int16 if a.dtype == torch.bfloat16 else torch.int32
    return a.dtype == b.dtype and torch.equal(a.contiguous().view(view), b.contiguous().view(view))


# ------------------------------------------------------------------ the ops


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_rows_do_not_depend_on_the_batch(dtype):
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(320, 192, generator=g).to(dtype)
    x = torch.randn(200, 192, generator=g).to(dtype)
    linear = DeterministicLinear(weight)
    full = linear(x)
    for start, rows in [(0, 1), (5, 1), (3, 2), (7, 3), (0, 4), (11, 17), (100, 64)]:
        assert same_bits(linear(x[start : start + rows]), full[start : start + rows]), (start, rows)


def test_trainable_linear_matches_the_inference_copy_and_has_gradients():
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 32, generator=g, requires_grad=True)
    x = torch.randn(9, 32, generator=g, requires_grad=True)
    y = DeterministicLinear(weight)(x)
    with torch.no_grad():
        assert same_bits(y.detach(), DeterministicLinear(weight.detach())(x.detach()))
    y.square().sum().backward()
    expected_w, expected_x = torch.autograd.grad((x @ weight.T).square().sum(), (weight, x))
    torch.testing.assert_close(weight.grad, expected_w)
    torch.testing.assert_close(x.grad, expected_x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_one_query_against_a_longer_cache_equals_the_full_causal_rows(dtype):
    """Query t of a causal forward over T keys vs the same query alone against a cache padded
    with garbage past t (one more block than it needs)."""
    g = torch.Generator().manual_seed(0)
    b, kv_heads, group, t, d = 2, 2, 3, 70, 32
    length = 2 * KEY_BLOCK
    q = torch.randn(b, t, kv_heads * group, d, generator=g).to(dtype)
    k = torch.randn(b, kv_heads, length, d, generator=g).to(dtype)
    v = torch.randn(b, kv_heads, length, d, generator=g).to(dtype)
    full = attention(q, k, v, attention_bias(torch.arange(t).expand(b, t), length))
    for pos in (0, 5, 63, 64, 69):
        cache_len = 3 * KEY_BLOCK
        kc = torch.cat((k[:, :, : pos + 1], torch.randn(b, kv_heads, cache_len - pos - 1, d, generator=g).to(dtype)), 2)
        vc = torch.cat((v[:, :, : pos + 1], torch.randn(b, kv_heads, cache_len - pos - 1, d, generator=g).to(dtype)), 2)
        one = attention(q[:, pos : pos + 1], kc, vc, attention_bias(torch.full((b, 1), pos), cache_len))
        assert same_bits(one, full[:, pos : pos + 1]), pos


@pytest.mark.parametrize("width", [192, 32, 40])
def test_folded_rms_norm_rows_do_not_depend_on_the_batch(width):
    """Every row count from 1 to 70 (vector bodies and scalar tails of each elementwise kernel)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(70, width, generator=g) * 3
    eps = torch.tensor(width * 1e-6)
    full = folded_rms_norm(x, eps)
    for rows in range(1, 71):
        assert same_bits(folded_rms_norm(x[70 - rows :], eps), full[70 - rows :]), rows
    torch.testing.assert_close(full * width**0.5, torch.nn.functional.rms_norm(x, (width,), eps=1e-6))


# ------------------------------------------------------------------ model: decode, chunks


@pytest.mark.parametrize("name", ["tiny", "tiny-moe", "tiny-llama"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_chunked_prefill_and_decode_equal_the_full_forward(name, dtype):
    cfg = preset(name).model_copy(update={"dtype": dtype, "num_hidden_layers": 2})
    model = build_model(cfg, seed=0)
    seqs = torch.randint(0, 256, (3, 30), generator=torch.Generator().manual_seed(1))
    full, full_experts = model(seqs, return_experts=True, deterministic=True)
    with torch.inference_mode():
        cache = KVCache.for_model(cfg, 4, 40)
        pieces, experts = [], []
        for lo, hi in [(0, 5), (5, 12), (12, 13), *[(p, p + 1) for p in range(13, 30)]]:
            pos = torch.arange(lo, hi).expand(3, -1)
            out = model(seqs[:, lo:hi], positions=pos, cache=cache, slots=range(3),
                        return_experts=True, deterministic=True)
            pieces.append(out[0])
            experts.append(out[1])
        single = model(seqs[1:2], deterministic=True)
    assert same_bits(torch.cat(pieces, 1), full.detach())
    assert same_bits(single[0], full[1].detach())
    if full_experts is not None:
        assert torch.equal(torch.cat(experts, 1), full_experts)


# ------------------------------------------------------------------ engine == trainer


def _trajectories(results) -> list[Trajectory]:
    return [
        Trajectory(task_id=str(i), group_id=i // 2, reward=float(i % 3), segments=[Segment(
            prompt_ids=r.prompt_ids, completion_ids=r.token_ids, logprobs=r.logprobs,
            versions=r.versions, loss_mask=[1] * len(r.token_ids), experts=r.experts,
            prompt_experts=r.prompt_experts)])
        for i, r in enumerate(results)
    ]


def _generate_rounds(model, batch_sizes, new_tokens=6, numerics="deterministic", seed=0):
    engine = Engine(model, ByteTokenizer(), EngineConfig(
        numerics=numerics, max_batch_size=64, max_new_tokens=new_tokens, max_seq_len=64, seed=seed))
    g = torch.Generator().manual_seed(seed)
    results = []
    for size in batch_sizes:
        results += engine.generate([
            GenerationRequest(prompt_ids=torch.randint(0, 256, (int(n),), generator=g).tolist(),
                              ignore_eos=True, stop=[], temperature=0.8)
            for n in torch.randint(2, 20, (size,), generator=g)
        ])
    return results


@pytest.mark.parametrize("name", ["tiny", "tiny-moe", "tiny-llama"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_engine_logprobs_equal_the_trainers_bit_for_bit(name, dtype):
    """Batch sizes 1..64 in one engine (so sequences of different rounds see different batch
    compositions); the trainer recomputes every token on an fp32 policy computing in ``dtype``."""
    policy = build_model(preset(name).model_copy(update={"num_hidden_layers": 2}), seed=0)
    serving = copy.deepcopy(policy).to(getattr(torch, dtype))
    results = _generate_rounds(serving, [1, 2, 5, 64])
    trainer = Trainer(policy, TrainerConfig(dtype=dtype, micro_batch_size=16), temperature=0.8,
                      numerics="deterministic")
    totals = trainer.accumulate_gradients(collate(_trajectories(results), pad_id=0, normalize_std=True))
    assert totals.mismatch.tokens == sum(len(r.token_ids) for r in results)
    assert totals.mismatch.bitwise_equal_fraction == 1.0
    assert totals.mismatch.kl_k3 == 0.0
    if name == "tiny-moe":
        assert totals.routing.flip_rate == 0.0
        assert totals.replay_filled_positions == 0  # prompt experts came from the prefill


def test_fast_mode_is_not_bitwise_but_close():
    """The peer the deterministic mode is measured against: the fused serving path."""
    model = build_model(preset("tiny").model_copy(update={"num_hidden_layers": 2}), seed=0)
    results = _generate_rounds(model, [3, 9], numerics="fast")
    trainer = Trainer(model, TrainerConfig(), temperature=0.8, numerics="fast")
    totals = trainer.accumulate_gradients(collate(_trajectories(results), pad_id=0, normalize_std=True))
    assert totals.mismatch.bitwise_equal_fraction < 1.0
    assert totals.mismatch.max_abs_logprob_diff < 1e-4


def test_engine_records_prompt_experts_of_its_prefill():
    model = build_model(preset("tiny-moe").model_copy(update={"num_hidden_layers": 2}), seed=0)
    (r,) = _generate_rounds(model, [1])
    _, experts = model(torch.tensor([r.prompt_ids + r.token_ids[:-1]]), return_experts=True,
                       deterministic=True)
    p = len(r.prompt_ids)
    assert torch.equal(torch.tensor(r.prompt_experts), experts[0, : p - 1])
    assert torch.equal(torch.tensor(r.experts), experts[0, p - 1 :])


# ------------------------------------------------------------------ router replay


def test_replay_keeps_the_engines_routing_when_the_trainers_router_would_flip():
    model = build_model(preset("tiny-moe").model_copy(update={"num_hidden_layers": 2}), seed=0)
    results = _generate_rounds(model, [8], new_tokens=12)
    perturbed = copy.deepcopy(model)
    with torch.no_grad():  # a router a little off the engine's: some top-k choices change
        for layer in perturbed.model.layers:
            layer.mlp.gate.weight.add_(torch.randn_like(layer.mlp.gate.weight) * 0.01)
    tb = collate(_trajectories(results), pad_id=0, normalize_std=True)
    own = Trainer(copy.deepcopy(perturbed), TrainerConfig(router_replay="off"), temperature=0.8).accumulate_gradients(tb)
    assert own.routing.trained_flip_rate > 0  # without replay the trainer trains other experts
    replay = Trainer(perturbed, TrainerConfig(router_replay="required"), temperature=0.8).accumulate_gradients(tb)
    assert replay.routing.flip_rate > 0  # its router still disagrees...
    assert replay.routing.trained_flip_rate == 0.0  # ...but the forward ran the engine's experts
    assert perturbed.model.layers[0].mlp.gate.weight.grad is not None  # and the router learns


def test_required_replay_refuses_a_batch_without_experts():
    model = build_model(preset("tiny-moe").model_copy(update={"num_hidden_layers": 2}), seed=0)
    trajs = _trajectories(_generate_rounds(model, [2]))
    for t in trajs:
        t.segments[0].experts = None
        t.segments[0].prompt_experts = None
    tb = collate(trajs, pad_id=0, normalize_std=True)
    with pytest.raises(MissingExpertsError, match="router_replay"):
        Trainer(model, TrainerConfig(router_replay="required"), temperature=0.8).accumulate_gradients(tb)
    totals = Trainer(model, TrainerConfig(router_replay="if_available"), temperature=0.8).accumulate_gradients(tb)
    assert totals.mismatch.bitwise_equal_fraction == 1.0  # own routing is the engine's here


def test_mismatch_counts_only_tokens_of_the_trainers_version():
    model = build_model(preset("tiny").model_copy(update={"num_hidden_layers": 2}), seed=0)
    trajs = _trajectories(_generate_rounds(model, [4]))
    stale = trajs[0].segments[0]
    stale.versions = [5] * len(stale.versions)  # sampled by other weights than the trainer's 0
    totals = Trainer(model, TrainerConfig(), temperature=0.8).accumulate_gradients(collate(trajs, 0, True))
    expected = sum(len(t.segments[0].completion_ids) for t in trajs[1:])
    assert totals.mismatch.tokens == expected
    assert totals.mismatch.bitwise_equal_fraction == 1.0


def test_deterministic_numerics_need_the_trainer_in_the_engines_dtype():
    with pytest.raises(ValueError, match="trainer.dtype"):
        TidalConfig(model={"dtype": "float32"}, trainer={"dtype": "bfloat16"})
    TidalConfig(model={"dtype": "float32"}, trainer={"dtype": "bfloat16"}, engine={"numerics": "fast"})
    TidalConfig(model={"dtype": "auto"}, trainer={"dtype": "auto"})  # one machine: one "auto"


def test_step_log_reports_the_off_policy_correction_counts():
    from tidal.trajectory import Batch

    model = build_model(preset("tiny").model_copy(update={"num_hidden_layers": 2}), seed=0)
    trajs = _trajectories(_generate_rounds(model, [4]))
    cfg = TrainerConfig(off_policy={"kind": "masked_is", "mask_low": 0.99, "mask_high": 1.01})
    metrics = Trainer(model, cfg, temperature=0.8).step(Batch(trajs, trainer_version=0))
    assert metrics.off_policy.is_masked_tokens == 0  # bitwise on-policy: every w is exactly 1
    assert metrics.off_policy.is_weight_mean == 1.0
    assert metrics.mismatch.bitwise_equal_fraction == 1.0


def test_moe_stacked_route_for_few_tokens_equals_the_per_expert_route(monkeypatch):
    """numerics/moe.py: the decode-sized route (one matmul over all experts' stacked matrices)
    and the per-expert route give every token the same bits, with and without replay."""
    from tidal.numerics import moe

    model = build_model(preset("tiny-moe").model_copy(update={"num_hidden_layers": 1}), seed=0)
    with torch.inference_mode():
        weights = model.fused_weights("deterministic", torch.float32)
        layer, silu_mul = weights.layers[0], weights.ops.silu_mul
        assert layer.router_gate_up is not None
        h = torch.randn(1, 40, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
        replay = torch.randint(0, model.config.num_experts, (40, 2), generator=torch.Generator().manual_seed(1))
        replay[:, 1] = (replay[:, 0] + 1) % model.config.num_experts  # two distinct experts
        for rows in (1, 2, 5, 17, 40):
            for ids in (None, replay[:rows]):
                monkeypatch.setattr(moe, "FEW_TOKENS", 64)
                stacked, own_s = moe.sparse_moe(layer, h[:, :rows], 2, True, ids, silu_mul)
                monkeypatch.setattr(moe, "FEW_TOKENS", 0)
                per_expert, own_p = moe.sparse_moe(layer, h[:, :rows], 2, True, ids, silu_mul)
                assert same_bits(stacked, per_expert), rows
                assert torch.equal(own_s, own_p)


# ------------------------------------------------------------------ the start-up probe


def _break_path(monkeypatch, path: str, odd_rows: bool = True):
    """Make DeterministicLinear's ``path`` and its -padded form non-invariant: calls with an odd
    row count (or, odd_rows False, a one-row call: the padded form then holds) get one ulp added,
    as a kernel that changes its blocking with the row count would."""
    from tidal.numerics import ops, probe

    honest = ops.DeterministicLinear._product  # the kernel's call, after any padding

    def call(self, x):
        out = honest(self, x)
        rows = x.numel() // x.shape[-1]
        if self.path.removesuffix("-padded") == path and (rows % 2 if odd_rows else rows == 1):
            out = torch.nextafter(out, torch.full_like(out, float("inf")))
        return out

    monkeypatch.setattr(ops.DeterministicLinear, "_product", call)
    probe.clear_cache()
    monkeypatch.setattr(probe, "_CACHE", {})


def test_probe_takes_the_next_path_when_an_op_fails_its_check(monkeypatch):
    """An injected non-invariant linear: the probe rejects it, the forward runs the next path
    (split-k) and the engine's logprobs still equal the trainer's bit for bit."""
    from tidal.numerics import probe

    _break_path(monkeypatch, "onednn")
    paths = probe.choose_paths(torch.float32)
    assert paths.linear == "split-k"
    rejected = paths.results[0].candidates[0]
    assert rejected.path == "onednn" and not rejected.holds and "rows" in rejected.failure
    policy = build_model(preset("tiny-moe").model_copy(update={"num_hidden_layers": 1}), seed=0)
    results = _generate_rounds(copy.deepcopy(policy), [1, 3], new_tokens=4)
    assert policy.fused_weights("deterministic", torch.float32).ops.paths.linear == "split-k"
    trainer = Trainer(policy, TrainerConfig(micro_batch_size=2), temperature=0.8)
    totals = trainer.accumulate_gradients(collate(_trajectories(results), pad_id=0, normalize_std=True))
    assert totals.mismatch.bitwise_equal_fraction == 1.0


def test_a_path_that_fails_at_one_row_alone_runs_padded_to_two(monkeypatch):
    """A kernel that sums a one-row call in another order (a GEMV) and holds from two rows: the
    probe takes its -padded form, and the engine's batch-1 decode equals the trainer's bits."""
    from tidal.numerics import probe

    _break_path(monkeypatch, "onednn", odd_rows=False)
    paths = probe.choose_paths(torch.float32)
    assert paths.linear == "onednn-padded"
    rejected = paths.results[0].candidates[0]
    assert rejected.path == "onednn" and "1 row" in rejected.failure
    policy = build_model(preset("tiny").model_copy(update={"num_hidden_layers": 1}), seed=0)
    results = _generate_rounds(copy.deepcopy(policy), [1, 1, 3], new_tokens=4)
    trainer = Trainer(policy, TrainerConfig(micro_batch_size=2), temperature=0.8)
    totals = trainer.accumulate_gradients(collate(_trajectories(results), pad_id=0, normalize_std=True))
    assert totals.mismatch.bitwise_equal_fraction == 1.0


def test_broken_path_is_caught_by_the_bitwise_check_itself(monkeypatch):
    """The injection is a real fault: forced onto the broken path, batch sizes disagree."""
    from tidal.numerics import ops

    _break_path(monkeypatch, "onednn")
    g = torch.Generator().manual_seed(0)
    linear = ops.DeterministicLinear(torch.randn(64, 32, generator=g), "onednn")
    x = torch.randn(8, 32, generator=g)
    assert not same_bits(linear(x[:3]), linear(x)[:3])


def _reassociate_one_row_calls(monkeypatch, columns: int = 4, width: int | None = None):
    """Make bf16 ``native`` a kernel that sums K in another order for one-row calls, in its first
    ``columns`` outputs only (as a GEMM whose tail rows run another micro-kernel would): a fault
    that shows in a rounded bf16 output only where the fp32 sums' rounding differs. With
    ``width``, only matrices of that input width have the fault (the rest are row-invariant)."""
    from tidal.numerics import ops, probe

    honest = ops.DeterministicLinear.__call__

    def call(self, x):
        if self.path != "native":
            return honest(self, x)
        xf, wf = x.float()[..., None, :], self.weight.float()
        out = (xf * wf).sum(-1)  # ATen's row reduction: an order fixed by the width alone
        if x.numel() // x.shape[-1] == 1 and width in (None, x.shape[-1]):
            half = x.shape[-1] // 2
            out[..., :columns] = ((xf[..., :half] * wf[:columns, :half]).sum(-1)
                                  + (xf[..., half:] * wf[:columns, half:]).sum(-1))
        return out.to(x.dtype)

    monkeypatch.setattr(ops.DeterministicLinear, "__call__", call)
    monkeypatch.setattr(probe, "_CACHE", {})


def test_probe_sees_a_reassociated_bf16_sum_that_normal_inputs_hide(monkeypatch):
    """Normal inputs pass the faulty kernel (136 rows x 4 outputs rarely round differently); the
    probe's cancelling inputs catch it and the next path is chosen (an Intel Xeon with AMX: bf16
    ``F.linear`` passed the normal inputs, then broke engine == trainer at K = 512)."""
    from tidal.numerics import probe
    from tidal.numerics.ops import DeterministicLinear

    _reassociate_one_row_calls(monkeypatch)
    shapes = probe.ProbeShapes(hidden=64, heads=2, kv_heads=1, head_dim=32,
                               matrices=((64, 512),), widths=(64,))
    weight = probe._inputs(64, 512, torch.bfloat16, seed=64 * 7 + 512)
    x = probe._inputs(probe.PROBE_BATCH, 512, torch.bfloat16, seed=512)
    assert probe.rows_invariant(DeterministicLinear(weight, "native"), x, (1,)) == ""  # hidden
    result = probe._probe_linear(torch.bfloat16, shapes, (1,))
    native = result.candidates[0]
    assert native.path == "native" and not native.holds and "cancelling" in native.failure
    assert result.path == "native-padded"  # the fault is one-row calls': two rows avoid it


def test_a_matrix_runs_the_faster_path_that_holds_at_its_own_shape(monkeypatch):
    """bf16 native broken at the 512-wide down projection only: that matrix runs the path that
    holds at every shape, the others keep native, and the engine's logprobs still equal the
    trainer's bit for bit (an Intel Xeon with AMX: native holds at K = 192, not at K = 512)."""
    from tidal.numerics import probe

    _reassociate_one_row_calls(monkeypatch, width=512)
    cfg = preset("tiny").model_copy(update={"num_hidden_layers": 1})
    paths = probe.choose_paths(torch.bfloat16, probe.ProbeShapes.of_model(cfg))
    assert paths.linear != "native" and paths.linear_path((192, 512)) == paths.linear
    assert paths.linear_path((192, 192)) == "native" and paths.linear_path((1024, 192)) == "native"
    assert "192x192=native" in paths.describe()
    policy = build_model(cfg, seed=0)
    serving = copy.deepcopy(policy).to(torch.bfloat16)
    with torch.no_grad():
        layer = serving.fused_weights("deterministic", torch.bfloat16).layers[0]
    assert layer.down.path == paths.linear and layer.qkv.path == "native"
    results = _generate_rounds(serving, [1, 3, 8], new_tokens=4)
    trainer = Trainer(policy, TrainerConfig(dtype="bfloat16", micro_batch_size=4), temperature=0.8,
                      numerics="deterministic")
    totals = trainer.accumulate_gradients(collate(_trajectories(results), pad_id=0, normalize_std=True))
    assert totals.mismatch.bitwise_equal_fraction == 1.0


def test_split_k_holds_where_every_whole_width_kernel_fails(monkeypatch):
    """On an AMD EPYC with native bf16, bf16 F.linear and the fp32 kernel both hold at width 576
    and both fail at SmolLM2's 1536-wide down projection (one row alone runs another kernel).
    Both broken at the 512-wide matrix here: it runs split-k (blocks of SPLIT_K columns, each an
    fp32 kernel at a width where it holds), the rest keep native, and engine == trainer."""
    from tidal.numerics import ops, probe

    honest = ops.DeterministicLinear.__call__

    def call(self, x):
        out = honest(self, x)
        wide = x.shape[-1] == 512 and self.path.removesuffix("-padded") in ("native", "fp32-accumulate")
        if wide and x.numel() // x.shape[-1] % 2:  # odd row counts take "another kernel"
            out = torch.nextafter(out, torch.full_like(out, float("inf")))
        return out

    monkeypatch.setattr(ops.DeterministicLinear, "__call__", call)
    monkeypatch.setattr(probe, "_CACHE", {})
    cfg = preset("tiny").model_copy(update={"num_hidden_layers": 1})
    paths = probe.choose_paths(torch.bfloat16, probe.ProbeShapes.of_model(cfg))
    assert paths.linear == "split-k" and paths.linear_path((192, 512)) == "split-k"
    # the others keep a whole-width kernel (native, or fp32-accumulate without native bf16)
    assert paths.linear_path((1024, 192)) in ("native", "fp32-accumulate")
    policy = build_model(cfg, seed=0)
    serving = copy.deepcopy(policy).to(torch.bfloat16)
    results = _generate_rounds(serving, [1, 3, 8], new_tokens=4)
    trainer = Trainer(policy, TrainerConfig(dtype="bfloat16", micro_batch_size=4), temperature=0.8,
                      numerics="deterministic")
    totals = trainer.accumulate_gradients(collate(_trajectories(results), pad_id=0, normalize_std=True))
    assert totals.mismatch.bitwise_equal_fraction == 1.0


def test_split_k_linear_equals_the_plain_product_and_trains():
    """split-k is a linear: close to x @ W.T, with a gradient, at a width that is not a multiple
    of its block."""
    from tidal.numerics.ops import SPLIT_K, DeterministicLinear

    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, SPLIT_K + 100, generator=g, requires_grad=True)
    x = torch.randn(5, SPLIT_K + 100, generator=g, requires_grad=True)
    y = DeterministicLinear(w, "split-k")(x)
    torch.testing.assert_close(y, x @ w.T, atol=1e-4, rtol=1e-4)
    y.sum().backward()
    torch.testing.assert_close(w.grad, x.sum(0).expand(64, -1).detach(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(x.grad, w.sum(0).expand(5, -1).detach(), atol=1e-4, rtol=1e-4)


def test_split_k_linear_in_bf16_trains_and_equals_its_no_grad_forward():
    """bf16 with autograd (the trainer) gives the engine's bits forward and bf16 gradients."""
    from tidal.numerics.ops import SPLIT_K, DeterministicLinear

    g = torch.Generator().manual_seed(1)
    w = torch.randn(48, 2 * SPLIT_K + 7, generator=g).bfloat16().requires_grad_()
    x = torch.randn(2, 3, 2 * SPLIT_K + 7, generator=g).bfloat16().requires_grad_()
    y = DeterministicLinear(w, "split-k")(x)
    with torch.no_grad():
        engine = DeterministicLinear(w.detach(), "split-k")(x.detach())
    assert y.dtype == torch.bfloat16 and torch.equal(y.detach(), engine)
    y.float().sum().backward()
    assert w.grad.dtype == torch.bfloat16 and x.grad.dtype == torch.bfloat16
    torch.testing.assert_close(w.grad.float(), x.detach().float().sum((0, 1)).expand(48, -1), atol=0.5, rtol=2e-2)


def test_no_path_that_holds_refuses_to_run_deterministic(monkeypatch):
    from tidal.numerics import mkl_cnr, probe

    monkeypatch.setattr(mkl_cnr, "strict_active", lambda: False)  # as in a process that never mid-trained
    _break_path(monkeypatch, "onednn")
    monkeypatch.setattr(probe, "rows_invariant", lambda fn, x, threads: "injected failure")
    with pytest.raises(probe.DeterminismUnavailable, match="linear.*numerics") as refused:
        probe.choose_paths(torch.float32)
    assert "strict reproducible mode" not in str(refused.value)


def test_a_refusal_after_mid_training_in_the_process_says_so(monkeypatch):
    """MKL's strict mode (on where mid-training ran in this process) changes its small matmuls,
    and a path can fail only then: the refusal names it and the way out."""
    from tidal.numerics import mkl_cnr, probe

    _break_path(monkeypatch, "onednn")
    monkeypatch.setattr(probe, "rows_invariant", lambda fn, x, threads: "injected failure")
    monkeypatch.setattr(mkl_cnr, "strict_active", lambda: True)
    with pytest.raises(probe.DeterminismUnavailable, match="strict reproducible mode.*process of its own"):
        probe.choose_paths(torch.float32)


@pytest.mark.parametrize("path", ["padded", "unpadded", "keys-first"])
def test_attention_gradients_equal_plain_attentions(path):
    """ops.attention's backward (one matmul per input, not autograd through the key blocks) is
    the gradient of softmax attention on every path: checked against plain fp64 math."""
    g = torch.Generator().manual_seed(0)
    b, t, kv, group, d, length = 2, 70, 2, 3, 32, 2 * KEY_BLOCK
    q = torch.randn(b, t, kv * group, d, generator=g, dtype=torch.float64).float().requires_grad_()
    k = torch.randn(b, kv, length, d, generator=g).requires_grad_()
    v = torch.randn(b, kv, length, d, generator=g).requires_grad_()
    bias = attention_bias(torch.arange(t).expand(b, t), length)
    w = torch.randn(b, t, kv * group * d, generator=g)
    got = torch.autograd.grad((attention(q, k, v, bias, path) * w).sum(), (q, k, v))
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    scores = torch.einsum("btkgd,bkld->bkgtl", q64.unflatten(2, (kv, group)), k64)
    scores = scores + bias.view(b, 1, 1, t, length).double()
    out = torch.einsum("bkgtl,bkld->btkgd", scores.softmax(-1), v64).reshape(b, t, -1)
    want = torch.autograd.grad((out * w.double()).sum(), (q64, k64, v64))
    for name, a, e in zip("qkv", got, want):
        torch.testing.assert_close(a.double(), e, atol=1e-4, rtol=1e-4, msg=name)


def test_probe_catches_a_row_that_differs_only_when_alone():
    """An op whose batch slices agree but whose one-row result differs for one row in the middle
    (what bf16 F.linear did here, and decode then parted from the full forward) is rejected."""
    from tidal.numerics import probe

    x = torch.randn(probe.PROBE_BATCH, 8, generator=torch.Generator().manual_seed(0))
    odd = x[41].clone()

    def op(rows):
        out = rows * 2.0
        if rows.shape[0] == 1 and torch.equal(rows[0], odd):
            out = out + 1e-6
        return out

    assert "1 row at offset 41" in probe.rows_invariant(op, x, (1,))
    assert probe.rows_invariant(lambda rows: rows * 2.0, x, (1,)) == ""


def test_probe_catches_a_kernel_that_blocks_differently_in_a_trainer_sized_call(monkeypatch):
    """A linear whose rows change only in calls above a few hundred rows (a GEMM that switches
    blocking for the trainer's micro-batch x sequence rows) passes the small-slice check but not
    the large-call one, and the probe then takes the next path."""
    from tidal.numerics import probe
    from tidal.numerics.ops import DeterministicLinear

    plain = DeterministicLinear.__call__

    def blocks_at_large_calls(self, x):
        out = plain(self, x)
        return out + 1e-3 if x.shape[0] > 1000 else out

    x = torch.randn(probe.PROBE_BATCH, 8, generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(DeterministicLinear, "__call__", blocks_at_large_calls)
    linear = DeterministicLinear(torch.randn(4, 8), "onednn")
    assert probe.rows_invariant(linear, x, (1,)) == ""  # the small slices cannot see it
    large = torch.randn(probe.LARGE_ROWS, 8)
    assert f"of a {probe.LARGE_ROWS}-row call" in probe.large_rows_invariant(linear, large, (1,))
    monkeypatch.setattr(DeterministicLinear, "__call__", plain)
    assert probe.large_rows_invariant(linear, large, (1,)) == ""
