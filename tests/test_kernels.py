"""Batch-invariant kernels (tidal.kernels) and the numerics-gpu benchmark, on the CPU.

The pure-torch reference ops run everywhere. The Triton kernels run here through Triton's
interpreter (TRITON_INTERPRET=1, CPU tensors) when triton is installed; on a GPU machine the
same kernels are compiled and checked by ``scripts/gpu_numerics.sh``.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tidal.bench.numerics_gpu import (
    Workload,
    generate_wave,
    make_prompts,
    run_numerics,
    trainer_pass,
)
from tidal.kernels import reference
from tidal.kernels.checks import run_kernel_checks
from tidal.kernels.moe_model import SIZES, MoEModel
from tidal.kernels.ops import DeterministicOps, FastOps
from tidal.kernels.routing import align_by_expert

HAVE_TRITON = importlib.util.find_spec("triton") is not None
NO_SYNC = lambda: None


def test_tree_sum_gives_a_row_the_same_bits_in_any_batch():
    x = torch.randn(37, 1000)
    full = reference.tree_sum(x)
    assert torch.equal(reference.tree_sum(x[5:6]), full[5:6])
    assert torch.equal(reference.tree_sum(x.flip(0)), full.flip(0))
    torch.testing.assert_close(full, x.double().sum(-1).float(), rtol=1e-5, atol=1e-4)


def test_align_by_expert_puts_each_assignment_once_in_a_tile_of_its_expert():
    ids = torch.tensor([3, 0, 3, 3, 1, 0, 3, 2, 2, 3, 0])
    rows, block_expert = align_by_expert(ids, num_experts=5, block_m=2)
    assert block_expert.numel() == -(-ids.numel() // 2) + 5
    placed = rows[rows >= 0]
    assert sorted(placed.tolist()) == list(range(ids.numel()))
    tiles = rows.view(-1, 2)
    for tile, expert in zip(tiles, block_expert.tolist()):
        members = tile[tile >= 0]
        if expert < 0:
            assert members.numel() == 0
        else:
            assert (ids[members] == expert).all() and members.tolist() == sorted(members.tolist())


def test_reference_ops_pass_the_device_kernel_checks():
    """The checks the GPU script runs first (accuracy vs torch, row invariance, decode vs
    prefill attention), here with the pure-torch reference."""
    records = run_kernel_checks("cpu")
    assert [r["name"] for r in records if not r["ok"]] == []
    assert len(records) == 7


def test_functional_moe_matches_tidal_qwen3_on_the_same_weights():
    """The benchmark's model is tidal's architecture: same weights, same logits (fp32)."""
    from tidal.model.config import ModelConfig
    from tidal.model.qwen3 import build_model

    shape = SIZES["tiny"]
    fields = {k: v for k, v in shape.as_dict().items() if k in ModelConfig.model_fields}
    ref = build_model(ModelConfig(**fields, tie_word_embeddings=False), seed=3).eval()
    model = MoEModel.from_tidal_state_dict(shape, ref.state_dict())
    ids = torch.randint(0, shape.vocab_size, (2, 9))
    with torch.no_grad():
        want, want_experts = ref(ids, return_experts=True)
    slot, pos = torch.arange(2).repeat_interleave(9), torch.arange(9).repeat(2)
    for ops in (FastOps(), DeterministicOps(use_triton=False)):
        hidden, experts = model.forward(ops, ids.reshape(-1), slot, pos, model.new_cache(2, 9), 9,
                                        seg_lens=[9, 9])
        got = model.logprobs(ops, hidden).view(2, 9, -1)
        torch.testing.assert_close(got, torch.log_softmax(want, -1), rtol=1e-4, atol=1e-4)
        assert torch.equal(experts.view(2, 9, *experts.shape[1:]).sort(-1).values,
                           want_experts.sort(-1).values)


def test_tiny_cpu_run_is_bitwise_equal_in_deterministic_mode(tmp_path):
    path = tmp_path / "numerics.json"
    result = run_numerics("tiny", "cpu", json_path=str(path))
    assert path.exists() and result["errors"] == {}
    det, fast = result["deterministic"], result["fast"]
    assert det["generated_tokens"] == fast["generated_tokens"] > 100
    for key in ("no_replay", "replay"):
        assert det[key]["bitwise_equal_fraction"] == 1.0
        assert det[key]["kl_k3"] == 0.0 and det[key]["max_abs_logprob_diff"] == 0.0
        assert det[key]["flip_rate"] == 0.0
    assert fast["replay"]["flip_rate"] == 0.0  # replay: the trainer uses the engine's experts
    assert fast["no_replay"]["bitwise_equal_fraction"] < 1.0  # the gap deterministic mode closes
    assert result["throughput_ratio"] > 0
    assert len(det["rounds"]) == len(fast["rounds"]) == result["repeats"] == 2  # median of 2, each mode
    assert result["fast_experts"] == "grouped_mm"  # torch._grouped_mm passed its first-call check


def test_replay_keeps_the_engines_experts_when_the_trainers_router_differs():
    """Perturb the trainer's router so its own top-k flips; replay still trains the engine's."""
    shape = SIZES["tiny"]
    model = MoEModel.random(shape, "cpu", torch.float32, seed=1)
    ops = DeterministicOps(use_triton=False)
    (prompts, gen_lens), = make_prompts(Workload((4,), (3, 6), (4, 8)), shape.vocab_size, 0)
    wave, _, _ = generate_wave(model, ops, prompts, gen_lens, torch.Generator().manual_seed(0), NO_SYNC)
    for layer in model.layers:
        layer.router += 0.05 * torch.randn_like(layer.router)
    _, _, engine_ex, own = trainer_pass(model, ops, wave, replay=False)
    _, _, _, replayed = trainer_pass(model, ops, wave, replay=True)
    assert not torch.equal(own.sort(-1).values, engine_ex.sort(-1).values)
    assert torch.equal(replayed, engine_ex)


def _run_interpreted(what: str) -> dict:
    """Run tests/triton_interpreted.py WHAT in a fresh process: TRITON_INTERPRET must be set
    before triton is first imported (Triton's own jit helpers are decorated then), and other
    test modules may already have imported it here."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    script = Path(__file__).with_name("triton_interpreted.py")
    done = subprocess.run([sys.executable, str(script), what], check=False, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed")
def test_triton_kernels_pass_the_checks_in_the_interpreter():
    records = _run_interpreted("checks")
    assert len(records) == 7
    assert [r for r in records if not r["ok"]] == []


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed")
def test_triton_kernels_make_engine_and_trainer_bitwise_equal():
    """The whole engine/trainer path on the Triton kernels (interpreted): bf16, GQA, MoE."""
    result = _run_interpreted("model")
    for key in ("no_replay", "replay"):
        assert result[key]["tokens"] > 10
        assert result[key]["bitwise_equal_fraction"] == 1.0
        assert result[key]["flip_rate"] == 0.0


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed")
def test_fused_kernels_match_the_torch_ops_they_replace():
    result = _run_interpreted("fused")
    assert result["align_equal"] and result["route_ids_equal"] and result["combine_equal"]
    assert result["route_gate_err"] < 1e-6


HOPPER_SIGNATURES = {
    "matmul": ("_matmul_kernel", {
        "x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "rows_ptr": "*i64", "block_expert_ptr": "*i64",
        "res_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_we": "i32",
        "stride_wn": "i32", "stride_om": "i32"},
        [{"GROUPED": g, "ROW_DIV": r, "SWIGLU": sw, "RESIDUAL": res, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64}
         for g, r, sw, res in ((False, 1, False, False), (False, 1, False, True), (True, 4, False, False),
                               (True, 1, True, False))]),
    "rowwise": ("_rms_norm_kernel", {
        "x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "width": "i32", "stride_x": "i32",
        "stride_o": "i32", "eps": "fp32"}, [{"BLOCK": 2048}, {"BLOCK": 128}]),
    "attention": ("_attention_kernel", {
        "q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "out_ptr": "*bf16", "slot_ptr": "*i64",
        "pos_ptr": "*i64", "scale": "fp32", "stride_qn": "i32", "stride_qh": "i32", "stride_ks": "i32",
        "stride_kh": "i32", "stride_kl": "i32", "stride_on": "i32", "stride_oh": "i32"},
        [{"GROUP": 4, "HEAD_DIM": 128, "BLOCK_N": 64}]),
    "fused": ("_qkv_kernel", {
        "qkv_ptr": "*bf16", "q_norm_ptr": "*bf16", "k_norm_ptr": "*bf16", "cos_ptr": "*fp32", "sin_ptr": "*fp32",
        "q_out_ptr": "*bf16", "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16", "slot_ptr": "*i64", "pos_ptr": "*i64",
        "eps": "fp32", "stride_qkv": "i32", "stride_rope": "i32", "stride_qo": "i32", "stride_cs": "i32",
        "stride_ch": "i32", "stride_cl": "i32"}, [{"HQ": 16, "HKV": 4, "D": 128}]),
    "fused_route": ("_route_kernel", {
        "logits_ptr": "*bf16", "ids_ptr": "*i64", "gates_ptr": "*fp32", "E": "i32", "stride_l": "i32"},
        [{"REPLAY": r, "NORM": True, "TOPK": 4, "K_POW2": 4, "E_POW2": 32} for r in (False, True)]),
    "fused_align": ("_align_kernel", {
        "ids_ptr": "*i64", "rows_ptr": "*i64", "block_expert_ptr": "*i64", "A": "i32", "num_blocks": "i32"},
        [{"E": 32, "E_POW2": 32, "BLOCK_M": 64, "CHUNK": 256}]),
    "fused_combine": ("_combine_kernel", {
        "y_ptr": "*bf16", "w_ptr": "*fp32", "res_ptr": "*bf16", "out_ptr": "*bf16", "H": "i32"},
        [{"TOPK": 4, "BLOCK": 1024}]),
}


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TRITON or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="needs triton's compiler (not the interpreter)")
def test_triton_kernels_compile_to_hopper_machine_code():
    """The compiled path (not the interpreter): each kernel lowers to sm_90 cubin here, without
    a GPU, and the matmuls use Hopper's wgmma tensor-core instructions."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", 90, 32)
    signatures = dict(HOPPER_SIGNATURES)
    signatures["softmax"] = ("_softmax_kernel", {
        "x_ptr": "*fp32", "out_ptr": "*fp32", "width": "i32", "stride_x": "i32", "stride_o": "i32"},
        [{"LOG": True, "CHUNK": 2048}, {"LOG": False, "CHUNK": 32}])
    for module_name, (kernel, args, variants) in signatures.items():
        file = {"softmax": "rowwise"}.get(module_name, module_name.split("_")[0])
        module = importlib.import_module(f"tidal.kernels.{file}")
        for constants in variants:
            signature = {**args, **{name: "constexpr" for name in constants}}
            compiled = triton.compile(ASTSource(getattr(module, kernel), signature, constants),
                                      target=target, options={"num_warps": 4})
            assert compiled.asm["cubin"], (kernel, constants)
            if module_name == "matmul":
                assert "wgmma" in compiled.asm["ptx"], constants


def test_fast_attention_matches_the_oracle_in_prefill_and_decode():
    """The benchmark's peer is correct: padded causal flash attention over whole sequences and
    grouped-query decode against the cache both match fp32 softmax attention (GQA)."""
    from tidal.kernels.checks import _masked_attention

    torch.manual_seed(0)
    hq, hkv, d, lens = 8, 2, 16, [5, 9, 1]
    ops, width = FastOps(), max(lens) + 3
    slot = torch.arange(len(lens)).repeat_interleave(torch.tensor(lens))
    pos = torch.cat([torch.arange(n) for n in lens])
    q, k, v = torch.randn(len(pos), hq, d), torch.randn(len(pos), hkv, d), torch.randn(len(pos), hkv, d)
    cache_k, cache_v = torch.zeros(3, hkv, width, d), torch.zeros(3, hkv, width, d)
    prefill = ops.attention(q, k, v, cache_k, cache_v, slot, pos, lens, max(lens), 0.25)
    torch.testing.assert_close(prefill, _masked_attention(q, cache_k, cache_v, slot, pos, 0.25))
    step_slot, step_pos = torch.tensor([2, 0]), torch.tensor([1, 5])  # next token of sequences 2, 0
    q1, k1, v1 = torch.randn(2, hq, d), torch.randn(2, hkv, d), torch.randn(2, hkv, d)
    decode = ops.attention(q1, k1, v1, cache_k, cache_v, step_slot, step_pos, None, 6, 0.25)
    torch.testing.assert_close(decode, _masked_attention(q1, cache_k, cache_v, step_slot, step_pos, 0.25))


def test_fast_experts_grouped_gemm_matches_the_padded_bmm_and_falls_back(monkeypatch, capsys):
    torch.manual_seed(0)
    m, hidden, inter, experts, k = 11, 32, 16, 6, 2
    x = torch.randn(m, hidden, dtype=torch.bfloat16)
    gate_up = 0.1 * torch.randn(experts, 2 * inter, hidden, dtype=torch.bfloat16)
    down = 0.1 * torch.randn(experts, hidden, inter, dtype=torch.bfloat16)
    ids = torch.stack([torch.randperm(experts)[:k] for _ in range(m)])  # some experts unused
    ids[ids == 5] = 4
    weights = torch.rand(m, k)
    grouped = FastOps()
    assert grouped.grouped_mm is True
    got = grouped.experts(x, ids, weights, gate_up, down)
    assert grouped.grouped_mm == "checked"
    padded = FastOps()
    padded.grouped_mm = False
    want = padded.experts(x, ids, weights, gate_up, down)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    ref = torch.zeros(m, hidden)
    for row in range(m):
        for j in range(k):
            e = ids[row, j]
            gate, up = (x[row].float() @ gate_up[e].float().T).chunk(2)
            ref[row] += weights[row, j] * (torch.nn.functional.silu(gate) * up) @ down[e].float().T
    torch.testing.assert_close(got.float(), ref, rtol=3e-2, atol=3e-2)

    def broken(*args, **kwargs):
        raise RuntimeError("not on this GPU")

    monkeypatch.setattr(torch, "_grouped_mm", broken)
    failing = FastOps()
    assert torch.equal(failing.experts(x, ids, weights, gate_up, down), want)
    assert failing.grouped_mm is False and "not on this GPU" in capsys.readouterr().err
