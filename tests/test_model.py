"""The model against transformers' Qwen3 / Qwen3-MoE, the KV cache against a full forward, MoE
capture and replay, and checkpoint I/O including every error a user can cause."""

import copy
import json
import pickle
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from tidal.model import (
    CheckpointError, KVCache, ModelConfig, build_model, from_pretrained, preset, save_pretrained,
)
from tidal.model.checkpoint import COMPLETE_MARKER, config_from_hf, config_to_hf
from tidal.numerics.fast import PackedLinear

transformers = pytest.importorskip("transformers")

TOL = 1e-4


def small_cfg(moe: bool = False, tied: bool = True, norm_topk: bool = True) -> ModelConfig:
    return ModelConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
        rope_theta=1000.0, tie_word_embeddings=tied, num_experts=4 if moe else 0,
        num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=norm_topk,
    )


def hf_model(moe: bool, tied: bool, norm_topk: bool = True):
    """A transformers model built from its own config class (not ours), every tensor perturbed
    so that norms and router are not at their init values."""
    common = dict(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0}, tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    if moe:
        cfg = transformers.Qwen3MoeConfig(
            **common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
            norm_topk_prob=norm_topk,
        )
        model = transformers.Qwen3MoeForCausalLM(cfg)
    else:
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def ids(b=2, t=9, vocab=64, seed=1):
    return torch.randint(0, vocab, (b, t), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ equality with transformers


@pytest.mark.parametrize("moe,tied,norm_topk", [(False, True, True), (False, False, True),
                                                (True, False, True), (True, True, False)])
def test_hf_checkpoint_loads_with_identical_logits(tmp_path, moe, tied, norm_topk):
    ref = hf_model(moe, tied, norm_topk)
    ref.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path)
    assert ours.config.tie_word_embeddings == tied and ours.config.norm_topk_prob == norm_topk
    x = ids()
    with torch.no_grad():
        diff = (ours(x) - ref(x).logits.float()).abs().max().item()
    assert diff <= TOL


@pytest.mark.parametrize("moe,tied,norm_topk", [(False, True, True), (True, False, True),
                                                (True, True, False)])
def test_the_one_fused_forward_matches_transformers(tmp_path, moe, tied, norm_topk):
    """model/fused.py, the forward the engine and the trainer run, on both CPU op sets: the
    deterministic one without a cache (the trainer's pass) and with one (the engine's chunked
    prefill + decode), and the fast one with a cache, against transformers' logits."""
    ref = hf_model(moe, tied, norm_topk)
    ref.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path)
    x = ids(3, 11)
    pos = torch.arange(11).expand(3, 11)
    with torch.no_grad():
        want = ref(x).logits.float()
        got = {"deterministic": ours(x, deterministic=True)}
        for mode in ("deterministic", "fast"):
            cache = KVCache.for_model(ours.config, num_slots=3, max_len=11)
            parts = [ours(x[:, a:b], positions=pos[:, a:b], cache=cache, slots=range(3),
                          deterministic=mode == "deterministic") for a, b in ((0, 6), (6, 7), (7, 11))]
            got[f"{mode}, cached"] = torch.cat(parts, 1)
    for name, logits in got.items():
        assert (logits - want).abs().max().item() <= TOL, name


@pytest.mark.parametrize("moe,tied", [(False, True), (False, False), (True, True), (True, False)])
def test_our_checkpoint_loads_in_transformers(tmp_path, moe, tied):
    ours = build_model(small_cfg(moe, tied), seed=3)
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    save_pretrained(ours, tmp_path / "ckpt")
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt").eval()
    assert type(ref).__name__ == ("Qwen3MoeForCausalLM" if moe else "Qwen3ForCausalLM")
    x = ids()
    with torch.no_grad():
        diff = (ours(x) - ref(x).logits.float()).abs().max().item()
    assert diff <= TOL


def test_config_round_trip():
    for cfg in (small_cfg(moe=True, tied=False, norm_topk=False), preset("small"), preset("tiny")):
        assert config_from_hf(config_to_hf(cfg)) == cfg
    # A dense config.json says nothing about experts; everything that shapes the model survives.
    dense = config_from_hf(config_to_hf(small_cfg()))
    assert dense.model_dump(exclude={"moe_intermediate_size"}) == small_cfg().model_dump(
        exclude={"moe_intermediate_size"})


# ------------------------------------------------------------------ KV cache


def run_cached(model, cache, tokens, positions, slots):
    with torch.no_grad():
        return model(tokens, positions=positions, cache=cache, slots=slots, return_experts=True)


@pytest.mark.parametrize("moe", [False, True])
def test_cached_prefill_and_decode_match_full_forward(moe):
    model = build_model(small_cfg(moe), seed=0).eval()
    cfg = model.config
    seqs = [ids(1, 12, seed=5)[0], ids(1, 12, seed=6)[0]]
    with torch.no_grad():
        full = [model(s[None], return_experts=True) for s in seqs]
    cache = KVCache.for_model(cfg, num_slots=4, max_len=16)
    slots = torch.tensor([2, 0])
    # Prefill lengths 6 and 3 together; row 1 is right-padded with positions -1.
    lens = [6, 3]
    tok = torch.zeros(2, 6, dtype=torch.long)
    pos = torch.full((2, 6), -1)
    for r, n in enumerate(lens):
        tok[r, :n], pos[r, :n] = seqs[r][:n], torch.arange(n)
    logits, experts = run_cached(model, cache, tok, pos, slots)
    for r, n in enumerate(lens):
        assert torch.allclose(logits[r, :n], full[r][0][0, :n], atol=1e-5)
        if moe:
            assert torch.equal(experts[r, :n], full[r][1][0, :n])
    # A chunk of 2 more tokens for row 1 only (row 0 idle: all padding), then joint decode.
    tok = torch.stack([torch.zeros(2, dtype=torch.long), seqs[1][3:5]])
    pos = torch.tensor([[-1, -1], [3, 4]])
    before = cache.k[0][2].clone()
    logits, _ = run_cached(model, cache, tok, pos, slots)
    assert torch.equal(cache.k[0][2], before), "padding tokens must not be written"
    assert torch.allclose(logits[1], full[1][0][0, 3:5], atol=1e-5)
    lens = [6, 5]
    for _ in range(4):
        tok = torch.tensor([[seqs[0][lens[0]]], [seqs[1][lens[1]]]])
        logits, experts = run_cached(model, cache, tok, torch.tensor([[lens[0]], [lens[1]]]), slots)
        for r in range(2):
            assert torch.allclose(logits[r, 0], full[r][0][0, lens[r]], atol=1e-5)
            if moe:
                assert torch.equal(experts[r, 0], full[r][1][0, lens[r]])
        lens = [n + 1 for n in lens]


def test_cache_fast_paths_match_full_forward():
    """Slots given as a range (cache rows read as views, no gather) through every case the
    cached forward plans differently: a fresh prefill of equal prompts (causal over the new keys),
    a chunk continuing all rows at the same positions (masked), decode at one position (no mask),
    a chunk where one row is padding, and decode at different positions."""
    model = build_model(small_cfg(), seed=0).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    seqs = ids(3, 12, seed=7)
    with torch.no_grad():
        full = model(seqs)
    cache = KVCache.for_model(model.config, num_slots=5, max_len=16)
    slots = range(1, 4)

    def feed(start: int, width: int, idle_rows=()):
        pos = torch.arange(start, start + width).expand(3, width).clone()
        pos[list(idle_rows)] = -1
        logits = run_cached(model, cache, seqs[:, start : start + width], pos, slots)[0]
        for r in set(range(3)) - set(idle_rows):
            torch.testing.assert_close(logits[r], full[r, start : start + width], atol=1e-5, rtol=0)

    feed(0, 4)  # fresh prefill
    feed(4, 3)  # chunk at 4..6
    feed(7, 1)  # decode, one position
    feed(8, 2, idle_rows=[2])  # row 2 is padding: written nowhere
    pos = torch.tensor([[10], [10], [8]])  # decode at different positions
    tok = seqs.gather(1, pos)
    logits = run_cached(model, cache, tok, pos, slots)[0]
    torch.testing.assert_close(logits[:, 0], full[torch.arange(3), pos[:, 0]], atol=1e-5, rtol=0)
    assert not cache.k[0][0].any() and not cache.k[0][4].any(), "rows outside the slots stay empty"


def test_logits_at_selects_one_column_per_row():
    model = build_model(small_cfg(), seed=0).eval()
    x, at = ids(3, 9), torch.tensor([8, 0, 4])
    with torch.no_grad():
        full = model(x)[torch.arange(3), at]
        torch.testing.assert_close(model(x, logits_at=at), full, atol=1e-6, rtol=0)
        cache = KVCache.for_model(model.config, num_slots=3, max_len=9)
        cached = model(x, positions=torch.arange(9).expand(3, 9), cache=cache, slots=range(3),
                       logits_at=at)
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=0)


def test_cached_forward_follows_weight_updates():
    """The cached forward's fused weights are derived copies: every way parameters change (an
    in-place load, an optimizer-style in-place update, a load that replaces tensors, a dtype
    cast) must reach it, or the engine would sample from stale weights."""
    model, other = build_model(small_cfg(), seed=0).eval(), build_model(small_cfg(), seed=1).eval()
    x = ids(2, 6)

    def cached(m):
        cache = KVCache.for_model(m.config, num_slots=2, max_len=6, dtype=m.lm_head.weight.dtype)
        with torch.no_grad():
            return m(x, positions=torch.arange(6).expand(2, 6), cache=cache, slots=range(2))

    def agrees(m, atol=1e-5):
        with torch.no_grad():
            torch.testing.assert_close(cached(m), m(x), atol=atol, rtol=0)

    agrees(model)
    model.load_state_dict(other.state_dict())
    agrees(model)
    torch.testing.assert_close(cached(model), cached(other), atol=1e-6, rtol=0)
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight.mul_(3.0)
        model.model.layers[0].input_layernorm.weight.add_(0.5)
    agrees(model)
    model.load_state_dict({k: v.clone() * 1.5 for k, v in other.state_dict().items()}, assign=True)
    agrees(model)
    model.tie_weights()
    agrees(model)
    agrees(model.to(torch.bfloat16), atol=5e-2)  # bf16: norms unfolded, RMSNorm's exact form


def test_a_serving_model_still_deep_copies_and_pickles():
    """The serving weights hold oneDNN tensors, which cannot be serialised; copies leave them out
    and rebuild them."""
    model = build_model(small_cfg(), seed=0).eval()
    x, pos = ids(2, 5), torch.arange(5).expand(2, 5)

    def cached(m):
        with torch.no_grad():
            return m(x, positions=pos, cache=KVCache.for_model(m.config, 2, 5), slots=range(2))

    before = cached(model)
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert torch.equal(cached(clone), before)


def test_packed_linear_matches_linear():
    w = torch.randn(256, 128)
    layer = PackedLinear(w)
    assert (layer.packed is not None) == torch.backends.mkldnn.is_available()
    for rows in (1, 64):  # one row stays on F.linear, 64 rows take oneDNN (where available)
        x = torch.randn(rows, 3, 128)
        torch.testing.assert_close(layer(x), F.linear(x, w), atol=1e-4, rtol=1e-5)


def test_cache_errors_are_clear():
    model = build_model(small_cfg(), seed=0)
    cache = KVCache.for_model(model.config, num_slots=2, max_len=8)
    x = ids(1, 4)
    with pytest.raises(ValueError, match="slots"):
        model(x, cache=cache)
    with pytest.raises(ValueError, match="slots must lie"):
        model(x, cache=cache, slots=torch.tensor([5]))
    with pytest.raises(ValueError, match="consecutive slots"):
        model(x, cache=cache, slots=range(1, 3))
    end = cache.max_len  # 8 rounded up to whole key blocks
    with pytest.raises(ValueError, match=f"max_len {end}"):
        model(x, positions=torch.arange(end - 2, end + 2)[None], cache=cache, slots=torch.tensor([0]))
    with pytest.raises(RuntimeError, match="inference-only"):
        model(x, cache=cache, slots=range(1))


# ------------------------------------------------------------------ MoE capture and replay


def test_return_experts_is_the_routers_top_k():
    model = build_model(small_cfg(moe=True), seed=0).eval()
    router_logits = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, i, o: router_logits.append(o))
             for layer in model.model.layers]
    x = ids(3, 7)
    with torch.no_grad():
        _, experts = model(x, return_experts=True)
    for h in hooks:
        h.remove()
    assert experts.shape == (3, 7, 2, 2) and experts.dtype == torch.long
    for layer, lg in enumerate(router_logits):
        want = torch.topk(torch.softmax(lg.float(), -1), 2, dim=-1).indices.view(3, 7, 2)
        assert torch.equal(experts[:, :, layer], want)
    assert build_model(small_cfg(), seed=0)(x, return_experts=True)[1] is None


def test_replay_own_experts_is_identical_and_trains_the_router():
    model = build_model(small_cfg(moe=True), seed=0)
    x = ids(2, 8)
    logits, experts = model(x, return_experts=True)
    replayed = model(x, replay_experts=experts)
    assert torch.equal(logits, replayed)
    replayed.logsumexp(-1).sum().backward()
    for layer in model.model.layers:
        assert layer.mlp.gate.weight.grad.abs().sum() > 0
    other = (experts + 1) % model.config.num_experts
    assert not torch.allclose(model(x, replay_experts=other), logits, atol=1e-3)


def test_replay_errors_are_clear():
    x = ids(2, 5)
    with pytest.raises(ValueError, match="dense"):
        build_model(small_cfg(), seed=0)(x, replay_experts=torch.zeros(2, 5, 2, 2, dtype=torch.long))
    moe = build_model(small_cfg(moe=True), seed=0)
    with pytest.raises(ValueError, match=r"expected \[B, T, layers, k\]"):
        moe(x, replay_experts=torch.zeros(2, 5, 2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="outside"):
        moe(x, replay_experts=torch.full((2, 5, 2, 2), 4))


# ------------------------------------------------------------------ build, presets, dtypes


def test_build_is_seeded_and_respects_dtype_and_tying():
    a, b = build_model(preset("tiny"), seed=7), build_model(preset("tiny"), seed=7)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    cfg = preset("tiny-moe").model_copy(update={"dtype": "bfloat16"})
    m = build_model(cfg, seed=0)
    assert m.lm_head.weight is m.model.embed_tokens.weight
    assert m.model.layers[0].mlp.experts.gate_up_proj.dtype == torch.bfloat16
    assert m(ids(1, 5, vocab=260)).dtype == torch.float32
    with pytest.raises(ValueError, match="tiny-moe"):
        preset("huge")


# ------------------------------------------------------------------ checkpoint formats


def test_save_is_atomic_and_replaces(tmp_path):
    model = build_model(small_cfg(moe=True), seed=0)
    save_pretrained(model, tmp_path / "ckpt")
    (tmp_path / "ckpt" / "stale.txt").write_text("old")
    save_pretrained(model, tmp_path / "ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert (tmp_path / "ckpt" / COMPLETE_MARKER).is_file()
    assert not (tmp_path / "ckpt" / "stale.txt").exists()
    loaded = from_pretrained(tmp_path / "ckpt", dtype=torch.bfloat16)
    assert loaded.model.embed_tokens.weight.dtype == torch.bfloat16
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    x = ids()
    assert torch.allclose(from_pretrained(tmp_path / "ckpt")(x), model(x), atol=0)


def test_sharded_and_fused_expert_checkpoints_load(tmp_path):
    model = build_model(small_cfg(moe=True, tied=False), seed=0)
    save_pretrained(model, tmp_path / "src")
    tensors = load_file(tmp_path / "src" / "model.safetensors")
    sd = model.state_dict()  # rewrite the experts in the fused transformers-5 layout
    tensors = {n: t for n, t in tensors.items() if not re.search(r"\.experts\.\d+\.", n)}
    tensors.update({k: v.clone() for k, v in sd.items() if ".mlp.experts." in k})
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    out = tmp_path / "sharded"
    out.mkdir()
    (out / "config.json").write_text((tmp_path / "src" / "config.json").read_text())
    for file, keys in shards.items():
        save_file({k: tensors[k].contiguous() for k in keys}, out / file)
    weight_map = {k: f for f, keys in shards.items() for k in keys}
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    x = ids()
    assert torch.equal(from_pretrained(out)(x), model(x))


# ------------------------------------------------------------------ checkpoint errors


@pytest.fixture
def ckpt(tmp_path) -> Path:
    save_pretrained(build_model(small_cfg(moe=True), seed=0), tmp_path / "ckpt")
    return tmp_path / "ckpt"


def edit_tensors(folder: Path, fn) -> None:
    path = folder / "model.safetensors"
    tensors = fn(load_file(path))
    save_file(tensors, path)


def rewrite_config(folder: Path, **changes) -> None:
    d = json.loads((folder / "config.json").read_text())
    d.update(changes)
    (folder / "config.json").write_text(json.dumps(d))


def truncate(path: Path, size: int) -> None:
    path.write_bytes(path.read_bytes()[:size])


def drop(tensors: dict, name: str) -> dict:
    return {k: v for k, v in tensors.items() if k != name}


ERRORS = {
    "folder missing": (lambda f: f.rename(f.with_name("moved")), "does not exist"),
    "config missing": (lambda f: (f / "config.json").unlink(), "config.json is missing"),
    "config not json": (lambda f: (f / "config.json").write_text("{oops"), "not valid JSON"),
    "model_type": (lambda f: rewrite_config(f, model_type="llama"), "'llama' is not supported"),
    "rope scaling": (lambda f: rewrite_config(f, rope_parameters={"rope_type": "yarn", "factor": 4.0}),
                     "RoPE scaling"),
    "weights missing": (lambda f: (f / "model.safetensors").unlink(), "no model.safetensors"),
    "truncated": (lambda f: truncate(f / "model.safetensors", 999), "truncated or corrupt"),
    "corrupt": (lambda f: (f / "model.safetensors").write_bytes(b"\x10" + b"\x00" * 7 + b"not json" * 3),
                "truncated or corrupt"),
    "missing tensor": (lambda f: edit_tensors(f, lambda t: drop(t, "model.layers.1.mlp.gate.weight")),
                       r"missing 1 \['model.layers.1.mlp.gate.weight'\]"),
    "unexpected tensor": (lambda f: edit_tensors(f, lambda t: {**t, "model.extra.weight": torch.ones(2)}),
                          r"unexpected 1 \['model.extra.weight'\]"),
    "wrong layers": (lambda f: rewrite_config(f, num_hidden_layers=3), "missing"),
    "shape": (lambda f: edit_tensors(f, lambda t: {**t, "model.norm.weight": torch.ones(7)}),
              r"model.norm.weight .* shape \[7\], config.json implies \[32\]"),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_checkpoint_errors_name_what_to_fix(ckpt, case):
    damage, message = ERRORS[case]
    damage(ckpt)
    with pytest.raises(CheckpointError, match=message):
        from_pretrained(ckpt)


def test_packed_linear_takes_onednn_from_the_calibrated_row_count(monkeypatch):
    """The fast op set's MKL/oneDNN switch is measured per machine and shape; PackedLinear
    honours it (here forced to 16 rows) and both sides agree with F.linear to float rounding."""
    from tidal.numerics import fast

    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN")
    assert fast.onednn_from_rows(256, 128) in (None, *fast.CALIBRATION_ROWS)
    monkeypatch.setattr(fast, "onednn_from_rows", lambda out_dim, in_dim: 16)
    w = torch.randn(256, 128)
    layer = fast.PackedLinear(w)
    calls = []
    real = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", lambda *a: calls.append(1) or real(*a))
    for rows, onednn in ((15, False), (16, True), (40, True)):
        calls.clear()
        x = torch.randn(rows, 128)
        torch.testing.assert_close(layer(x), F.linear(x, w), atol=1e-4, rtol=1e-5)
        assert bool(calls) == onednn, rows
