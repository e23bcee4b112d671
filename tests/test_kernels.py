"""Batch-invariant kernels (tidal.kernels), the GPU op sets and the numerics-gpu benchmark, on
the CPU.

The pure-torch reference kernels run everywhere. The Triton kernels, and the Triton op set
through tidal's model (CausalLM, the one fused forward), run here through Triton's interpreter
(TRITON_INTERPRET=1, CPU tensors, TIDAL_OPS=gpu) when triton is installed; on a GPU machine the
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

from tidal.bench.numerics_gpu import BenchSection, run_numerics
from tidal.config import load_config
from tidal.kernels import reference
from tidal.kernels.checks import run_kernel_checks
from tidal.kernels.fast_ops import FastGpuOps
from tidal.kernels.routing import align_by_expert
from tidal.model import KVCache, build_model, preset

HAVE_TRITON = importlib.util.find_spec("triton") is not None


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


def test_tiny_cpu_run_is_bitwise_equal_in_deterministic_mode(tmp_path):
    """The benchmark end to end on the CPU op sets (the same model calls as on a GPU)."""
    path = tmp_path / "numerics.json"
    result = run_numerics(BenchSection(device="cpu"), load_config(), json_path=str(path))
    assert path.exists() and result["errors"] == {}
    det, fast = result["deterministic"], result["fast"]
    assert det["generated_tokens"] == fast["generated_tokens"] > 100
    for key in ("no_replay", "replay"):
        assert det[key]["bitwise_equal_fraction"] == 1.0
        assert det[key]["kl_k3"] == 0.0 and det[key]["max_abs_logprob_diff"] == 0.0
        assert det[key]["flip_rate"] == 0.0
    assert fast["no_replay"]["bitwise_equal_fraction"] < 1.0  # the gap deterministic mode closes
    assert result["cross_mode"]["max_abs_logprob_diff"] < 0.1
    assert result["throughput_ratio"] > 0
    assert result["targets"]["deterministic_bitwise_equal_100pct"]
    assert result["targets"]["deterministic_zero_flips"]
    assert len(det["rounds"]) == len(fast["rounds"]) == result["repeats"] == 2  # median of 2, each mode
    assert result["ops"] == "cpu" and result["fast_experts"] == "per_expert"
    assert result["config"]["bench"]["size"] == "tiny"
    assert result["config"]["model"] == result["model"]  # the size's preset, recorded as run


def _run_interpreted(what: str) -> dict:
    """Run tests/triton_interpreted.py WHAT in a fresh process: TRITON_INTERPRET must be set
    before triton is first imported (Triton's own jit helpers are decorated then), and other
    test modules may already have imported it here."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "TIDAL_OPS": "gpu",
           "PYTHONPATH": os.pathsep.join(sys.path)}
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
def test_triton_op_set_runs_the_model_close_bitwise_and_with_replay():
    """TritonOps through CausalLM (interpreted), tiny MoE: (a) logits close to the module
    forward in fp32 and bf16; (b) a chunked prefill + decode with a KV cache gives the full
    forward's logprobs bit for bit; (c) router replay: replaying the router's own experts
    changes nothing, replaying others gives the module forward's logits under the same replay."""
    result = _run_interpreted("model")
    assert result["float32"]["max_err"] < 1e-5
    assert result["bfloat16"]["max_err"] < 0.05
    assert result["float32"]["experts_equal"]  # bf16 rounding may flip a near-tied top-k
    for dtype in ("float32", "bfloat16"):
        assert result[dtype]["chunked_bitwise"] and result[dtype]["decode_slots_bitwise"]
    replay = result["replay"]
    assert replay["own_bitwise"] and replay["other_differs"]
    assert replay["other_err"] < 1e-5 and replay["own_topk_kept"]


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
        "stride_o": "i32", "eps": "fp32", "width_div": "fp32"},
        [{"HAS_WEIGHT": True, "BLOCK": 2048}, {"HAS_WEIGHT": False, "BLOCK": 128}]),
    "attention": ("_attention_kernel", {
        "q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "out_ptr": "*bf16", "slot_ptr": "*i64",
        "pos_ptr": "*i64", "scale": "fp32", "stride_qn": "i32", "stride_qh": "i32", "stride_ks": "i32",
        "stride_kh": "i32", "stride_kl": "i32", "stride_on": "i32", "stride_oh": "i32"},
        [{"GROUP": 4, "HEAD_DIM": 128, "BLOCK_N": 64}]),
    "fused": ("_qkv_kernel", {
        "qkv_ptr": "*bf16", "norm_ptr": "*bf16", "cos_ptr": "*bf16", "sin_ptr": "*bf16",
        "q_out_ptr": "*bf16", "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16", "slot_ptr": "*i64", "pos_ptr": "*i64",
        "eps": "fp32", "width_div": "fp32", "stride_qkv": "i32", "stride_rope": "i32", "stride_qo": "i32",
        "stride_cs": "i32", "stride_ch": "i32", "stride_cl": "i32"}, [{"HQ": 16, "HKV": 4, "D": 128}]),
    "fused_route": ("_route_kernel", {
        "logits_ptr": "*bf16", "ids_ptr": "*i64", "own_ptr": "*i64", "gates_ptr": "*fp32", "E": "i32",
        "stride_l": "i32"},
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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fast_gpu_op_set_runs_the_cached_model_close_to_the_module_forward(monkeypatch, dtype):
    """The benchmark's peer is correct: FastGpuOps (TIDAL_OPS=gpu, plain torch: no interpreter
    needed) in a padded prefill, a chunk at an offset and mixed-position decode steps, against
    the module forward (GQA, MoE)."""
    monkeypatch.setenv("TIDAL_OPS", "gpu")
    cfg = preset("numerics-gpu-tiny").model_copy(update={"dtype": dtype})
    model = build_model(cfg, seed=0).eval()
    ids = torch.randint(0, cfg.vocab_size, (3, 9), generator=torch.Generator().manual_seed(0))
    tol = dict(rtol=0, atol=1e-4) if dtype == "float32" else dict(rtol=0, atol=0.05)
    with torch.inference_mode():
        want = model(ids)
        assert isinstance(model.fused_weights("fast", model.lm_head.weight.dtype).ops, FastGpuOps)
        cache = KVCache.for_model(cfg, 3, 9)
        lens = torch.tensor([5, 3, 4])
        cols = torch.arange(5)
        pos = torch.where(cols < lens[:, None], cols, -1)  # right-padded prompts
        got = model(ids[:, :5], positions=pos, cache=cache, slots=range(3), logits_at=lens - 1)
        torch.testing.assert_close(got, want[torch.arange(3), lens - 1], **tol)
        for step in range(4):  # every row one token on, each at its own position
            p = (lens + step)[:, None]
            got = model(ids.gather(1, p), positions=p, cache=cache, slots=torch.tensor([0, 1, 2]))
            torch.testing.assert_close(got[:, 0], want[torch.arange(3), p[:, 0]], **tol)
        fresh = KVCache.for_model(cfg, 3, 9)
        model(ids[:, :4], positions=torch.arange(4).expand(3, 4), cache=fresh, slots=range(3))
        chunk = model(ids[:, 4:9], positions=torch.arange(4, 9).expand(3, 5), cache=fresh,
                      slots=range(3))
        torch.testing.assert_close(chunk, want[:, 4:9], **tol)


def test_fast_experts_grouped_gemm_matches_the_padded_bmm_and_falls_back(monkeypatch, capsys):
    torch.manual_seed(0)
    m, hidden, inter, experts, k = 11, 32, 16, 6, 2
    x = torch.randn(m, hidden, dtype=torch.bfloat16)
    gate_up = 0.1 * torch.randn(experts, 2 * inter, hidden, dtype=torch.bfloat16)
    down = 0.1 * torch.randn(experts, hidden, inter, dtype=torch.bfloat16)
    ids = torch.stack([torch.randperm(experts)[:k] for _ in range(m)])  # some experts unused
    ids[ids == 5] = 4
    weights = torch.rand(m, k)
    grouped = FastGpuOps()
    assert grouped.grouped_mm is True
    got = grouped.experts(x, ids, weights, gate_up, down)
    assert grouped.grouped_mm == "checked"
    padded = FastGpuOps()
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
    failing = FastGpuOps()
    assert torch.equal(failing.experts(x, ids, weights, gate_up, down), want)
    assert failing.grouped_mm is False and "not on this GPU" in capsys.readouterr().err
