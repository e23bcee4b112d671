"""The Llama architecture (ModelConfig.qk_norm = False: Qwen3 without the per-head q/k norms)
against transformers' LlamaForCausalLM both ways (their checkpoint in tidal, tidal's in
transformers), the config.json it reads and refuses, and the bit-for-bit properties of the one
fused forward (shared-prefix trainer forward == full forward) on the "tiny-llama" preset."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open

from tidal.model import (
    CheckpointError, KVCache, ModelConfig, build_model, from_pretrained, preset, save_pretrained,
)
from tidal.model.checkpoint import config_from_hf, config_to_hf
from tidal.model.shared_prefix import SharedPrefix

transformers = pytest.importorskip("transformers")

TOL = 1e-4
HAVE_TRITON = importlib.util.find_spec("triton") is not None

SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 576,
    "initializer_range": 0.041666666666666664, "intermediate_size": 1536, "is_llama_config": True,
    "max_position_embeddings": 8192, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3, "pad_token_id": 2,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_interleaved": False, "rope_scaling": None,
    "rope_theta": 100000, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.42.3", "use_cache": True, "vocab_size": 49152,
}
"""HuggingFaceTB/SmolLM2-135M-Instruct's config.json (the target Llama): no head_dim key, RoPE
theta at the top level, rope_scaling null."""


def hf_llama(tied: bool):
    """A transformers Llama from its own config class, every tensor perturbed so that norms are
    not at their init values."""
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, rms_norm_eps=1e-5,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def ids(b=3, t=11, vocab=64, seed=1):
    return torch.randint(0, vocab, (b, t), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ equality with transformers


@pytest.mark.parametrize("tied", [True, False])
def test_hf_llama_loads_and_every_forward_matches_transformers(tmp_path, tied):
    """Their checkpoint in tidal: the module forward, the deterministic fused forward without a
    cache (the trainer's) and with one (the engine's chunked prefill + decode), and the fast
    cached forward, each against transformers' logits."""
    ref = hf_llama(tied)
    ref.save_pretrained(tmp_path, safe_serialization=True)
    ours = from_pretrained(tmp_path)
    cfg = ours.config
    assert not cfg.qk_norm and cfg.tie_word_embeddings == tied
    assert (cfg.head_dim, cfg.rope_theta, cfg.rms_norm_eps) == (16, 100000.0, 1e-5)
    x = ids()
    pos = torch.arange(x.shape[1]).expand_as(x)
    with torch.no_grad():
        want = ref(x).logits.float()
        got = {"module": ours(x), "deterministic": ours(x, deterministic=True)}
        for mode in ("deterministic", "fast"):
            cache = KVCache.for_model(cfg, num_slots=3, max_len=11)
            parts = [ours(x[:, a:b], positions=pos[:, a:b], cache=cache, slots=range(3),
                          deterministic=mode == "deterministic") for a, b in ((0, 6), (6, 7), (7, 11))]
            got[f"{mode}, cached"] = torch.cat(parts, 1)
    for name, logits in got.items():
        assert (logits - want).abs().max().item() <= TOL, name


@pytest.mark.parametrize("tied", [True, False])
def test_our_llama_checkpoint_loads_in_transformers_unchanged(tmp_path, tied):
    cfg = preset("tiny-llama").model_copy(update={"num_hidden_layers": 2, "dtype": "float32",
                                                  "tie_word_embeddings": tied})
    ours = build_model(cfg, seed=3)
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    save_pretrained(ours, tmp_path / "ckpt")
    written = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert written["model_type"] == "llama" and written["architectures"] == ["LlamaForCausalLM"]
    assert not written["attention_bias"] and not written["mlp_bias"]
    with safe_open(str(tmp_path / "ckpt" / "model.safetensors"), "pt") as f:
        assert not [n for n in f.keys() if "q_norm" in n or "k_norm" in n]
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt").eval()
    assert type(ref).__name__ == "LlamaForCausalLM"
    assert ref.config.rms_norm_eps == cfg.rms_norm_eps
    x = ids(vocab=cfg.vocab_size)
    with torch.no_grad():
        diff = (ours(x) - ref(x).logits.float()).abs().max().item()
    assert diff <= TOL
    assert from_pretrained(tmp_path / "ckpt").config.model_dump(exclude={"init_from"}) == \
        cfg.model_dump(exclude={"init_from"})


# ------------------------------------------------------------------ config.json


def test_smollm2_config_reads_as_the_llama_it_is():
    cfg = config_from_hf(SMOLLM2_135M)
    assert cfg.model_dump(include={
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "qk_norm", "rope_theta",
        "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings", "dtype"}) == dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, head_dim=64, qk_norm=False,
        rope_theta=100000.0, rms_norm_eps=1e-5, max_position_embeddings=8192,
        tie_word_embeddings=True, dtype="bfloat16")
    assert config_from_hf(config_to_hf(cfg)) == cfg


def test_llama_takes_llamas_defaults_not_qwen3s():
    minimal = {k: SMOLLM2_135M[k] for k in ("model_type", "vocab_size", "hidden_size",
                                            "intermediate_size", "num_hidden_layers",
                                            "num_attention_heads")}
    cfg = config_from_hf(minimal)
    assert (cfg.head_dim, cfg.num_key_value_heads) == (64, 9)
    assert (cfg.rms_norm_eps, cfg.rope_theta, cfg.max_position_embeddings) == (1e-6, 10000.0, 2048)
    assert cfg.tie_word_embeddings is False
    assert config_from_hf({**minimal, "model_type": "qwen3"}).head_dim == 128  # Qwen3's default
    rope = {"rope_type": "default", "rope_theta": 5e5}
    theta = config_from_hf({**minimal, "rope_parameters": rope})
    assert theta.rope_theta == 5e5


def test_tiny_llama_preset_round_trips_through_config_json():
    cfg = preset("tiny-llama").model_copy(update={"dtype": "float32"})
    assert not cfg.qk_norm and cfg.rope_theta != preset("tiny").rope_theta
    d = config_to_hf(cfg)
    assert d["model_type"] == "llama" and "use_sliding_window" not in d
    assert config_from_hf(d) == cfg


REFUSED = {
    "attention_bias": ({"attention_bias": True}, "attention_bias"),
    "mlp_bias": ({"mlp_bias": True}, "mlp_bias"),
    "rope_scaling": ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling"),
    "rope_scaling (old key)": ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling"),
    "rope_parameters": ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_parameters"),
    "hidden_act": ({"hidden_act": "gelu"}, "hidden_act"),
    "experts": ({"num_local_experts": 8}, "qwen3_moe only"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_config_from_hf_refuses_what_tidal_does_not_implement(case):
    change, key = REFUSED[case]
    with pytest.raises(CheckpointError, match=key):
        config_from_hf({**SMOLLM2_135M, **change})


def test_harmless_llama_keys_are_accepted():
    cfg = config_from_hf({**SMOLLM2_135M, "pretraining_tp": 2,
                          "rope_scaling": {"rope_type": "default"}})
    assert not cfg.qk_norm


def test_a_llama_moe_is_refused_by_the_config():
    with pytest.raises(ValueError, match="qk_norm"):
        ModelConfig(qk_norm=False, num_experts=4)


# ------------------------------------------------------------------ bits


def _padded(seqs):
    out = torch.zeros(len(seqs), max(len(s) for s in seqs), dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = s
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shared_prefix_forward_equals_the_full_forward_bit_for_bit(dtype):
    """tests/test_model_prefix.py's check on tiny-llama: the trainer's shared-prefix forward
    gives every suffix token the full rows' logits, bit for bit."""
    model = build_model(preset("tiny-llama").model_copy(update={"num_hidden_layers": 2}), seed=0)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=g) for n in (5, 9, 70)]
    rows, owner = [], []
    for i, p in enumerate(prompts):
        for _ in range(3):
            n = int(torch.randint(1, 9, (1,), generator=g))
            rows.append(torch.cat([p, torch.randint(0, 256, (n,), generator=g)]))
            owner.append(i)
    lengths = torch.tensor([len(p) - 1 for p in prompts])
    prefix = SharedPrefix(_padded([p[:-1] for p in prompts]), lengths, torch.tensor(owner))
    suffixes = [r[int(lengths[o]):] for r, o in zip(rows, owner)]
    with torch.no_grad():
        full = model(_padded(rows), deterministic=True, dtype=dtype)
        out = model(_padded(suffixes), prefix=prefix, deterministic=True, dtype=dtype)
    for b, (s, o) in enumerate(zip(suffixes, owner)):
        start = int(lengths[o])
        assert torch.equal(out[b, :len(s)], full[b, start:start + len(s)]), b


_TRITON_LLAMA = """
import json, torch
torch.set_num_threads(1)
import tidal.kernels  # applies the interpreter patches
from tidal.kernels.triton_ops import TritonOps
from tidal.model import KVCache, ModelConfig, build_model

out = {}
ids = torch.randint(0, 260, (2, 7), generator=torch.Generator().manual_seed(0))
for dtype in ("float32", "bfloat16"):
    cfg = ModelConfig(qk_norm=False, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      rope_theta=100000.0, rms_norm_eps=1e-5, dtype=dtype)
    model = build_model(cfg, seed=0).eval()
    with torch.inference_mode():
        want = model(ids)
        full = model(ids, deterministic=True)
        assert isinstance(model.fused_weights("deterministic", getattr(torch, dtype)).ops, TritonOps)
        cache = KVCache.for_model(cfg, 2, 16)
        steps = [model(ids[:, :4], positions=torch.arange(4).expand(2, 4), cache=cache,
                       slots=range(2), deterministic=True)]
        for p in range(4, 7):
            steps.append(model(ids[:, p:p + 1], positions=torch.full((2, 1), p), cache=cache,
                               slots=range(2), deterministic=True))
    out[dtype] = {"max_err": float((full - want).abs().max()),
                  "chunked_bitwise": torch.equal(torch.log_softmax(torch.cat(steps, 1), -1),
                                                 torch.log_softmax(full, -1))}
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed")
def test_triton_op_set_runs_a_llama_close_and_bitwise():
    """The Triton kernels without q/k norms (qkv_to_cache NORMED=False), through Triton's
    interpreter on the CPU (a fresh process: TRITON_INTERPRET must precede triton's import):
    logits close to the module forward; chunked prefill + decode equal to the full forward."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "TIDAL_OPS": "gpu",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", _TRITON_LLAMA], check=False, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["float32"]["max_err"] < 1e-5
    assert result["bfloat16"]["max_err"] < 0.05
    assert result["float32"]["chunked_bitwise"] and result["bfloat16"]["chunked_bitwise"]


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TRITON or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="needs triton's compiler (not the interpreter)")
def test_the_qkv_kernel_without_norms_compiles_to_hopper_machine_code():
    """tests/test_kernels.py compiles the Qwen3 variant (NORMED defaults to True); this one."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tidal.kernels import fused

    signature = {
        "qkv_ptr": "*bf16", "norm_ptr": "*bf16", "cos_ptr": "*bf16", "sin_ptr": "*bf16",
        "q_out_ptr": "*bf16", "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16", "slot_ptr": "*i64",
        "pos_ptr": "*i64", "eps": "fp32", "width_div": "fp32", "stride_qkv": "i32",
        "stride_rope": "i32", "stride_qo": "i32", "stride_cs": "i32", "stride_ch": "i32",
        "stride_cl": "i32", "HQ": "constexpr", "HKV": "constexpr", "D": "constexpr",
        "NORMED": "constexpr"}
    constants = {"HQ": 9, "HKV": 3, "D": 64, "NORMED": False}  # SmolLM2-135M's heads
    compiled = triton.compile(ASTSource(fused._qkv_kernel, signature, constants),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    assert compiled.asm["cubin"]
