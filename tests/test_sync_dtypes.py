"""Mixed-dtype checkpoints through weight sync: `--dtype keep` and per-tensor rules, fp8 tensors
as bit patterns, a relay in between, and the errors a bad rule gets."""

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from tidal.bench.sync_codec import quantise_fp8
from tidal.cli import main
from tidal.config import ConfigError, load_config
from tidal.sync.config import SyncConfig
from tidal.sync.errors import SyncError
from tidal.sync.origin import ServerThread, VersionStore, make_app
from tidal.sync.relay import Relay
from tidal.sync.tensors import FP8_DTYPES, DtypeRule, cast_floats, serving_tensors

CFG = SyncConfig(chunk_elements=4096, anchor_every=10)
WEIGHTS = ("model.layers.0.mlp.up_proj.weight", "model.layers.0.self_attn.q_proj.weight")


def masters(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(160, 96, generator=g) * 0.02 for name in WEIGHTS}


def checkpoint(folder, master: dict[str, torch.Tensor], step: int) -> None:
    """An fp8 serving checkpoint in two shards: e4m3fn weights with fp32 block scales, bf16
    embeddings, fp32 norms, an int64 buffer, and every e4m3fn / e5m2 bit pattern (NaNs, -0)."""
    fp8 = {}
    for name, w in master.items():
        q, scale = quantise_fp8(w, block=64)
        fp8[name], fp8[f"{name}_scale_inv"] = q, scale
    every = torch.arange(256, dtype=torch.uint8)
    other = {"model.embed_tokens.weight": (master[WEIGHTS[0]][:, :32] * 3).to(torch.bfloat16),
             "model.norm.weight": torch.ones(96) + step * 1e-3,
             "model.layers.0.input_layernorm.weight": torch.linspace(0.5, 1.5, 96),
             "model.step": torch.tensor([step, -1], dtype=torch.int64),
             "model.patterns_e4m3": every.view(torch.float8_e4m3fn),
             "model.patterns_e5m2": every.clone().view(torch.float8_e5m2)}
    folder.mkdir(parents=True)
    save_file(fp8, str(folder / "model-00001-of-00002.safetensors"), metadata={"format": "pt"})
    save_file(other, str(folder / "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text('{"model_type": "test", "quantization_config": {"fmt": "e4m3"}}')


def read_all(folder) -> dict[str, tuple[str, bytes]]:
    """name -> (dtype, raw bytes) of every tensor of every safetensors file."""
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for k in f.keys():  # noqa: SIM118  (a safe_open handle is not iterable)
                t = f.get_tensor(k)
                out[k] = (str(t.dtype), t.contiguous().view(torch.uint8).numpy().tobytes())
    return out


def updated(master: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """The masters after a small optimiser-like update (the fp8 weights are re-quantised)."""
    g = torch.Generator().manual_seed(seed)
    return {k: v + torch.randn(v.shape, generator=g).sign() * 2e-4 for k, v in master.items()}


@pytest.fixture
def two_versions(tmp_path):
    m0 = masters()
    checkpoint(tmp_path / "ck0", m0, 0)
    checkpoint(tmp_path / "ck1", updated(m0, 1), 1)
    return tmp_path / "ck0", tmp_path / "ck1"


def test_mixed_fp8_checkpoint_with_keep_pulls_back_byte_identical_through_a_relay(tmp_path, two_versions, capsys):
    ck0, ck1 = two_versions
    root = tmp_path / "root"
    for ck in (ck0, ck1):
        assert main(["sync", "publish", str(ck), "--root", str(root), "--dtype", "keep",
                     "--sync.chunk_elements", "4096"]) == 0
    assert "version 1 (delta on 0)" in capsys.readouterr().out
    store = VersionStore(root)
    manifest = store.manifest(1, "delta")
    dtypes = {t.name: t.dtype for t in manifest.tensors}
    assert dtypes[WEIGHTS[0]] == "float8_e4m3fn" and dtypes["model.patterns_e5m2"] == "float8_e5m2"
    assert dtypes[f"{WEIGHTS[0]}_scale_inv"] == "float32" and dtypes["model.step"] == "int64"
    assert dtypes["model.embed_tokens.weight"] == "bfloat16"
    origin = ServerThread(make_app(store))
    relay = Relay([origin.url], tmp_path / "relay", CFG)
    relay_server = ServerThread(make_app(relay.store, relay))
    try:
        out = tmp_path / "out"
        assert main(["sync", "pull", "--upstream", relay_server.url, "--out", str(out), "--version", "0"]) == 0
        assert main(["sync", "pull", "--upstream", relay_server.url, "--out", str(out)]) == 0
        assert "version 1" in capsys.readouterr().out
    finally:
        relay_server.stop()
        origin.stop()
    for version, ck in ((0, out / "v00000000"), (1, out / "v00000001")):
        want = read_all(ck0 if version == 0 else ck1)
        assert read_all(ck) == want
    assert read_all(out / "v00000000") != read_all(out / "v00000001")  # the weights did move
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "config.json"):
        assert (out / "v00000001" / name).read_bytes() == (ck1 / name).read_bytes()


def test_a_delta_between_two_fp8_versions_is_bit_exact_and_small(two_versions, tmp_path):
    from tidal.sync.origin import Publisher
    from tidal.sync.pull import Puller
    from tidal.sync.tensors import read_safetensors_folder

    ck0, ck1 = two_versions
    v0, v1 = (read_safetensors_folder(ck) for ck in (ck0, ck1))
    pub = Publisher(tmp_path / "root", CFG)
    pub.publish(v0)
    (delta,) = pub.publish(v1)
    changed = sum(int((a.bits != b.bits).sum()) for a, b in zip(v0, v1))
    assert delta.kind == "delta" and changed > 0
    server = ServerThread(make_app(pub.store))
    try:
        puller = Puller([server.url], CFG)
        puller.pull(0)
        before = puller.bytes_fetched
        puller.pull(1)
    finally:
        server.stop()
    assert puller.manifest.kind == "delta"
    assert [(t.name, t.dtype, t.bits.tobytes()) for t in puller.tensors] == [
        (t.name, t.dtype, t.bits.tobytes()) for t in v1]
    assert puller.bytes_fetched - before < pub.store.manifest(0, "anchor").data_bytes / 2
    rebuilt = {t.name: t.to_torch() for t in puller.tensors}
    assert rebuilt[WEIGHTS[0]].dtype == torch.float8_e4m3fn


def state() -> dict[str, torch.Tensor]:
    return {"a.q_proj.weight": torch.arange(8, dtype=torch.uint8).view(torch.float8_e4m3fn),
            "a.q_proj.weight_scale_inv": torch.tensor([0.1]),
            "a.input_layernorm.weight": torch.ones(4, dtype=torch.bfloat16),
            "a.bias": torch.full((4,), 1 / 3, dtype=torch.float32),
            "a.ids": torch.arange(3)}


def dtypes_of(tensors) -> dict[str, str]:
    return {k: str(v.dtype).removeprefix("torch.") for k, v in tensors.items()}


def test_rules_apply_in_order_and_ints_are_never_cast(tmp_path):
    rules = [DtypeRule(pattern="*.weight_scale*", dtype="keep"), DtypeRule(pattern="*norm*", dtype="float32"),
             DtypeRule(pattern="*.q_proj.*", dtype="bfloat16"), DtypeRule(pattern="a.*", dtype="float16")]
    got = serving_tensors(state(), "float16", rules)
    assert dtypes_of(got) == {"a.q_proj.weight": "bfloat16", "a.q_proj.weight_scale_inv": "float32",
                              "a.input_layernorm.weight": "float32", "a.bias": "float16", "a.ids": "int64"}
    s = state()
    kept = serving_tensors(s, "keep")
    assert all(kept[k] is v for k, v in s.items())  # as stored: not even a copy
    # the same rules from a recipe's [sync] section, through `tidal sync publish`
    recipe = tmp_path / "r.toml"
    recipe.write_text('[sync]\nserving_dtype = "keep"\ndtype_rules = [{pattern = "*norm*", dtype = "float32"}, '
                      '{pattern = "*_scale_inv", dtype = "bfloat16"}]\n')
    cfg = load_config(recipe)
    assert cfg.sync.serving_dtype == "keep" and cfg.sync.dtype_rules[0] == DtypeRule(pattern="*norm*", dtype="float32")
    checkpoint(tmp_path / "ck", masters(), 0)
    assert main(["sync", "publish", str(tmp_path / "ck"), "--root", str(tmp_path / "root"), "--config", str(recipe)]) == 0
    published = {t.name: t.dtype for t in VersionStore(tmp_path / "root").manifest(0, "anchor").tensors}
    assert published["model.norm.weight"] == "float32" and published["model.embed_tokens.weight"] == "bfloat16"
    assert published[f"{WEIGHTS[0]}_scale_inv"] == "bfloat16" and published[WEIGHTS[0]] == "float8_e4m3fn"


def test_trainer_publisher_applies_the_same_rules(tmp_path):
    from tidal.model import build_model, preset
    from tidal.sync.transport import HttpWeightPublisher

    cfg = SyncConfig(dtype_rules=[{"pattern": "*norm*", "dtype": "float32"}])
    pub = HttpWeightPublisher(tmp_path / "w", cfg, "bfloat16")
    try:
        pub.publish(build_model(preset("tiny"), seed=0), 0)
        dtypes = {t.name: t.dtype for t in pub.publisher.store.manifest(0, "anchor").tensors}
    finally:
        pub.close()
    assert {d for n, d in dtypes.items() if "norm" in n} == {"float32"}
    assert {d for n, d in dtypes.items() if "norm" not in n} == {"bfloat16"}


@pytest.mark.parametrize("recipe, field", [
    ('dtype_rules = [{pattern = "*", dtype = "fp9"}]', "sync.dtype_rules.0.dtype"),
    ('dtype_rules = [{pattern = "*", dtype = "keep"}, {pattern = "", dtype = "keep"}]', "sync.dtype_rules.1.pattern"),
    ('dtype_rules = [{pattern = "*", dtype = "keep", cast = "x"}]', "sync.dtype_rules.0.cast"),
    ('serving_dtype = "int8"', "sync.serving_dtype"),
])
def test_a_bad_rule_is_a_config_error_naming_the_field(tmp_path, recipe, field):
    p = tmp_path / "r.toml"
    p.write_text(f"[sync]\n{recipe}\n")
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(p)


def test_a_lossy_fp8_cast_needs_to_be_asked_for(tmp_path, capsys):
    scale = DtypeRule(pattern="*", dtype="float8_e5m2")
    with pytest.raises(SyncError, match=r"sync\.dtype_rules\.0\.dtype \(pattern '\*'\) casts fp8 tensor a\.q_proj\.weight"):
        serving_tensors(state(), "keep", [scale])
    lossy = serving_tensors(state(), "keep", [scale.model_copy(update={"lossy": True})])
    assert lossy["a.q_proj.weight"].dtype == torch.float8_e5m2
    e8m0 = {"s": torch.arange(250, 256, dtype=torch.uint8).view(torch.float8_e8m0fnu)}
    with pytest.raises(SyncError, match=r"serving dtype 'float16' \(--dtype or sync\.serving_dtype\)"):
        serving_tensors(e8m0, "float16")
    assert serving_tensors(e8m0, "bfloat16")["s"].dtype == torch.bfloat16  # every e8m0 value fits bf16
    checkpoint(tmp_path / "ck", masters(), 0)
    root = str(tmp_path / "root")
    assert main(["sync", "publish", str(tmp_path / "ck"), "--root", root, "--dtype", "float8_e5m2"]) == 2
    assert "would cast fp8 tensor model.layers.0.mlp.up_proj.weight from float8_e4m3fn to float8_e5m2" in \
        capsys.readouterr().err
    assert main(["sync", "publish", str(tmp_path / "ck"), "--root", root, "--dtype", "fp8"]) == 2
    assert "--dtype: unknown dtype 'fp8'" in capsys.readouterr().err


def test_fp8_formats_of_this_torch_are_all_known():
    assert {str(d).removeprefix("torch.") for d in FP8_DTYPES} >= {"float8_e4m3fn", "float8_e5m2"}


def test_a_single_serving_dtype_casts_as_before(tmp_path, two_versions):
    ck0, _ = two_versions
    root = tmp_path / "root"
    assert main(["sync", "publish", str(ck0), "--root", str(root), "--dtype", "bfloat16"]) == 0
    published = {t.name: t.dtype for t in VersionStore(root).manifest(0, "anchor").tensors}
    assert published.pop("model.step") == "int64"
    assert set(published.values()) == {"bfloat16"}  # fp8 upcast (exactly), fp32 norms and scales cast
    s = state()
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) and a.dtype == b.dtype
               for a, b in zip(serving_tensors(s, "bfloat16").values(), cast_floats(s, "bfloat16").values()))
    assert SyncConfig().dtype_rules == []


@pytest.mark.parametrize("block", [64, 0])
def test_quantise_fp8_scales_each_block_to_the_e4m3_range(block):
    w = torch.randn(130, 70, generator=torch.Generator().manual_seed(0)) * 0.02
    w[0, 0] = 1e4  # one outlier: with one scale per tensor the small weights fall below e4m3's range
    q, scale = quantise_fp8(w, block)
    assert q.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
    assert scale.shape == ((3, 2) if block else (1,))
    tiles = scale.repeat_interleave(block, 0).repeat_interleave(block, 1)[:130, :70] if block else scale
    deq = q.float() * tiles
    assert q.float().abs().max() == 448.0  # the largest element of a tile maps to e4m3's max
    err = ((deq - w).abs() / tiles).max()
    assert err <= 448.0 / 16  # within half a step of e4m3 at the top of its range (3 mantissa bits)
    if block:  # a tile without the outlier keeps its own scale; one scale per tensor flushes it
        per_tensor = quantise_fp8(w, 0)
        far = (slice(64, 128), slice(0, 64))
        coarse = (per_tensor[0].float() * per_tensor[1] - w)[far].abs().mean()
        assert (deq - w)[far].abs().mean() < coarse / 4


def test_fp8_record_reports_fp8_beside_bf16():
    from tidal.bench.sync_bench import FP8_KEYS, fp8_record

    row = {k: 2.0 for k in FP8_KEYS}
    rec = fp8_record([row, {**row, "bytes": 4.0}], [{**row, "bytes": 1.0, "bytes_by_dtype": {"float32": 7}}], 128)
    assert rec["codec.fp8.bytes.float32"] == 7
    assert rec["codec.bf16.bytes"] == 3.0 and rec["codec.fp8.bytes"] == 1.0
    assert rec["codec.fp8.bytes_per_bf16_byte"] == pytest.approx(1 / 3)
    assert {f"codec.fp8.{k}" for k in ("ratio_vs_full", "encode_mb_s_per_core", "decode_mb_s_per_core")} <= set(rec)
