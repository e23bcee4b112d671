"""tidal.hardware (what this CPU can do), dtype "auto" in configs, and `tidal doctor --json`."""

import json

import pytest

from tidal import hardware
from tidal.cli import main
from tidal.config import TidalConfig, load_config
from tidal.config.dump import recipe_tree
from tidal.hardware import onednn_allows, parse_cpuinfo, read_cpu_facts, resolve_dtype
from tidal.model.config import ModelConfig
from tidal.trainer.config import TrainerConfig

AVX512 = "fpu sse sse2 sse4_1 sse4_2 avx f16c fma avx2 avx512f avx512dq avx512cd avx512bw avx512vl"

AMD_EPYC = f"""processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: {AVX512} avx512_vnni avx512_bf16 avx512_bitalg

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu
"""

INTEL_XEON = f"""processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: {AVX512} avx512ifma avx512vbmi avx512_vnni avx512_bitalg arch_capabilities
"""

INTEL_SPR = f"""processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: {AVX512} avx512_vnni avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8
"""


def test_cpuinfo_flags_of_the_first_processor_are_parsed():
    vendor, model, flags = parse_cpuinfo(AMD_EPYC)
    assert (vendor, model) == ("AuthenticAMD", "AMD EPYC 9R14 96-Core Processor")
    assert "avx512_bf16" in flags and "avx512bw" in flags and "fpu" in flags
    assert parse_cpuinfo("") == ("", "", frozenset())


def test_amd_epyc_with_avx512_bf16_has_native_bf16():
    f = read_cpu_facts(AMD_EPYC, {})
    assert f.vendor == "AuthenticAMD" and f.avx512_core and f.avx512_vnni and f.avx512_bf16
    assert not f.amx_bf16 and not f.amx_tile
    assert f.native_bf16 and f.bf16_reason == "avx512_bf16"
    assert f.onednn_levels[-1] == "AVX512_CORE_BF16" and "AVX512_CORE_AMX" not in f.onednn_levels
    assert f.aten_levels == ("default", "avx2", "avx512")
    assert f.onednn_max_cpu_isa is None and f.aten_cpu_capability_env is None


def test_intel_xeon_without_avx512_bf16_or_amx_has_no_native_bf16():
    f = read_cpu_facts(INTEL_XEON, {})
    assert f.vendor == "GenuineIntel" and f.avx512f and f.avx512_core and not f.avx512_bf16
    assert not f.native_bf16 and "avx512_bf16" in f.bf16_reason
    assert f.onednn_levels[-1] == "AVX512_CORE_VNNI"


def test_an_avx2_only_cpu_has_neither_avx512_nor_bf16():
    f = read_cpu_facts("vendor_id : AuthenticAMD\nflags : sse4_1 avx avx2 fma\n", {})
    assert f.avx2 and not f.avx512f and not f.avx512_core and not f.native_bf16
    assert f.onednn_levels == ("SSE41", "AVX", "AVX2") and f.aten_levels == ("default", "avx2")


@pytest.mark.parametrize("cap", ["AVX512_CORE", "avx2", "AVX512_CORE_VNNI", "AVX2_VNNI_2"])
def test_onednn_cap_below_bf16_turns_native_bf16_off(cap):
    f = read_cpu_facts(AMD_EPYC, {"ONEDNN_MAX_CPU_ISA": cap})
    assert f.onednn_max_cpu_isa == cap.upper()
    assert not f.native_bf16 and "excludes avx512_bf16" in f.bf16_reason


@pytest.mark.parametrize("cap", ["AVX512_CORE_BF16", "AVX512_CORE_AMX", "DEFAULT", "ALL"])
def test_onednn_cap_at_or_above_bf16_keeps_native_bf16(cap):
    assert read_cpu_facts(AMD_EPYC, {"ONEDNN_MAX_CPU_ISA": cap}).native_bf16


def test_amx_counts_only_where_the_cap_allows_amx():
    assert onednn_allows("AVX512_CORE_AMX", "AVX512_CORE_BF16")
    assert not onednn_allows("AVX512_CORE_BF16", "AVX512_CORE_AMX")
    assert not onednn_allows("AVX2_VNNI_2", "AVX512_CORE")  # not a superset despite the bigger mask
    spr = read_cpu_facts(INTEL_SPR, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"})
    assert spr.native_bf16 and spr.bf16_reason == "avx512_bf16"  # AMX capped, avx512_bf16 not
    assert read_cpu_facts(INTEL_SPR, {}).onednn_levels[-1] == "AVX512_CORE_AMX"


def test_aten_env_cap_is_recorded():
    assert read_cpu_facts(INTEL_XEON, {"ATEN_CPU_CAPABILITY": "avx2"}).aten_cpu_capability_env == "avx2"


@pytest.fixture(params=[AMD_EPYC, INTEL_XEON], ids=["amd_bf16", "intel_no_bf16"])
def machine(request, monkeypatch):
    """Pretend to run on that CPU: every "auto" resolves by its facts."""
    facts = read_cpu_facts(request.param, {})
    monkeypatch.setattr(hardware, "cpu_facts", lambda: facts)
    monkeypatch.delenv(hardware.AUTO_DTYPE_ENV, raising=False)  # conftest pins "auto" to fp32
    return facts


def test_the_auto_override_wins_and_a_bad_value_is_named(machine, monkeypatch):
    monkeypatch.setenv(hardware.AUTO_DTYPE_ENV, "float32")
    assert resolve_dtype("auto") == "float32"
    assert resolve_dtype("bfloat16") == "bfloat16"
    monkeypatch.setenv(hardware.AUTO_DTYPE_ENV, "fp8")
    with pytest.raises(ValueError, match="TIDAL_AUTO_DTYPE"):
        resolve_dtype("auto")


def test_resolve_dtype_auto_follows_native_bf16_and_explicit_names_pass(machine):
    assert resolve_dtype("auto") == ("bfloat16" if machine.native_bf16 else "float32")
    for name in ("float32", "bfloat16", "float16"):
        assert resolve_dtype(name) == name


def test_config_auto_is_resolved_and_explicit_dtypes_are_kept(machine):
    auto = "bfloat16" if machine.native_bf16 else "float32"
    cfg = load_config(None, ["--pretrain.dtype", "float32", "--sync.serving_dtype", "float16"])
    assert (cfg.model.dtype, cfg.trainer.dtype, cfg.sync.serving_dtype) == (auto, auto, "float16")
    assert cfg.pretrain.dtype == "float32"
    assert cfg.dtype_choices()["model.dtype"] == {"requested": "auto", "resolved": auto}
    assert cfg.dtype_choices()["pretrain.dtype"] == {"requested": "float32", "resolved": "float32"}
    tree = recipe_tree(cfg)  # what --dry-run writes: portable, so "auto" stays "auto"
    assert tree["model"]["dtype"] == tree["trainer"]["dtype"] == "auto"
    assert tree["pretrain"]["dtype"] == "float32" and tree["sync"]["serving_dtype"] == "float16"
    assert cfg.model_dump()["model"]["dtype"] == auto  # what a run folder records


def test_sections_built_alone_resolve_auto(machine):
    auto = "bfloat16" if machine.native_bf16 else "float32"
    assert TrainerConfig().dtype == ModelConfig().dtype == auto
    m = ModelConfig()
    assert m.requested_dtype("dtype") == "auto"
    other = "float32" if auto == "bfloat16" else "bfloat16"
    assert m.model_copy(update={"dtype": other}).requested_dtype("dtype") == other
    m.dtype = other
    assert m.requested_dtype("dtype") == other
    m.dtype = "auto"
    assert m.dtype == auto and m.requested_dtype("dtype") == "auto"


def test_deterministic_numerics_compare_the_resolved_dtypes(machine):
    auto = "bfloat16" if machine.native_bf16 else "float32"
    other = "float32" if auto == "bfloat16" else "bfloat16"
    TidalConfig(trainer={"dtype": auto})  # model "auto" = the same dtype here
    with pytest.raises(ValueError, match='trainer.dtype.*model.dtype is .*what "auto" is on this machine'):
        TidalConfig(trainer={"dtype": other})


def test_dry_run_keeps_auto_and_names_what_it_resolved_to(machine, capsys):
    from tidal.cli.run import TRAIN_DTYPES, dtype_line

    auto = "bfloat16" if machine.native_bf16 else "float32"
    assert main(["train", "--dry-run", "--trainer.dtype", auto]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("# dtype:"))  # after the env line
    assert line == f"# {dtype_line(load_config(None, ['--trainer.dtype', auto]), TRAIN_DTYPES)}"
    assert f"model auto -> {auto}, trainer {auto}," in line
    assert machine.cpu in line
    assert '[model]' in out and 'dtype = "auto"' in out and f'dtype = "{auto}"' in out


def test_doctor_json_has_stable_keys(tmp_path, capsys):
    from tidal.cli.doctor import DOCTOR_KEYS, ISA_FLAGS

    path = tmp_path / "doctor.json"
    assert main(["doctor", "--json", str(path)]) == 0
    record = json.loads(path.read_text())
    assert tuple(record) == DOCTOR_KEYS
    assert tuple(record["isa"]) == ISA_FLAGS
    assert set(record["cpu"]) == {"vendor", "model_name"}
    assert set(record["env_caps"]) == {"ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"}
    assert set(record["aten"]) == {"capability", "levels"}
    assert set(record["onednn"]) == {"available", "levels", "bf16_kernels", "isa", "bf16_matmul"}
    assert record["auto_dtype"] == resolve_dtype("auto") and isinstance(record["native_bf16"], bool)
    paths = record["deterministic_paths"]
    assert {(p["op"], p["dtype"]) for p in paths} >= {("linear", "float32"), ("linear", "bfloat16"),
                                                      ("attention", "bfloat16"), ("moe_stacked", "float32")}
    for p in paths:
        assert set(p) == {"op", "dtype", "path", "holds", "candidates", "threads", "by_shape"}
        assert p["holds"] == (p["path"] is not None)
        assert all(set(c) == {"path", "holds", "us_per_call", "failure"} for c in p["candidates"])
        assert p["path"] in {c["path"] for c in p["candidates"] if c["holds"]}
        tried = [c["path"] for c in p["candidates"]]  # a shape's own path: one tried before
        assert all(tried.index(own) < tried.index(p["path"]) for own in p["by_shape"].values())
    out = capsys.readouterr().out
    assert "native bf16:" in out and 'dtype "auto":' in out and "deterministic paths:" in out
