"""`tidal bench NAME`: --bench.* fills the benchmark's own section, other dotted keys the run config."""

import importlib

import pytest

from tidal.bench import BENCHMARKS
from tidal.bench import engine_bench as engine
from tidal.bench.config import config_record, is_configured, main, parse, with_preset
from tidal.cli import main as tidal_main
from tidal.config import ConfigError


def test_bench_keys_reach_the_section_and_dotted_keys_the_run_config(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text("[engine]\nmax_prefill_tokens = 512\n")
    bench, cfg, json_path = parse(engine, "engine", [
        str(recipe), "--bench.runs", "5", "--bench.batch_sizes", "1,4", "--engine.numerics", "fast",
        "--model.num_experts=8", "--json", str(tmp_path / "e.json")])
    assert (bench.runs, bench.batch_sizes, bench.new_tokens) == (5, [1, 4], 64)
    assert (cfg.engine.numerics, cfg.model.num_experts, cfg.engine.max_prefill_tokens) == ("fast", 8, 512)
    assert json_path == str(tmp_path / "e.json")
    record = config_record(bench, cfg, engine.READS)
    assert record["bench"]["batch_sizes"] == [1, 4] and record["engine.numerics"] == "fast"
    assert record["model"]["num_experts"] == 8


@pytest.mark.parametrize("args, words", [
    (["--bench.x", "1"], "unknown key 'bench.x' of benchmark 'engine'"),
    (["--bench.runs", "0"], "bench.runs: Input should be greater than or equal to 1"),
    (["--engine.x", "1"], "unknown config key 'engine.x'"),
    (["--runs", "3"], "unknown flag --runs for benchmark 'engine': its own settings are --bench.KEY"),
])
def test_a_wrong_key_is_one_clear_error_naming_it(capsys, args, words):
    assert tidal_main(["bench", "engine", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tidal bench: error:") and words in err


def test_python_dash_m_gives_the_same_clear_error(capsys):
    assert main(engine, "engine", ["--bench.nope", "1"]) == 2
    assert "unknown key 'bench.nope'" in capsys.readouterr().err


def test_help_lists_each_field_with_its_docstring_and_default(capsys):
    with pytest.raises(SystemExit) as done:
        tidal_main(["bench", "engine", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "--bench.runs  int, default 3" in out
    assert "Timed runs per side and batch size" in out  # BenchSection.runs' docstring
    assert "--SECTION.KEY VALUE" in out and "engine.numerics" in out  # the run config it reads


def test_an_override_the_benchmark_never_reads_is_noted(capsys):
    parse(engine, "engine", ["--trainer.lr", "1e-6"])
    assert "--trainer.lr is not read by this benchmark" in capsys.readouterr().err


def test_a_preset_starts_the_model_and_the_model_keys_given_apply_on_top():
    _, cfg, _ = parse(engine, "engine", ["--model.num_hidden_layers", "2"])
    moe = with_preset(cfg, "tiny-moe").model
    assert (moe.num_experts, moe.num_hidden_layers) == (8, 2)
    assert with_preset(cfg, "tiny").model == cfg.model  # tiny is the ModelConfig defaults
    with pytest.raises(ConfigError, match="model.num_experts_per_tok"):
        with_preset(parse(engine, "engine", ["--model.num_experts_per_tok", "9"])[1], "tiny-moe")


def test_every_field_of_every_benchmark_section_is_documented():
    """As for the run config (test_config): --help shows these docstrings."""
    sections = [m.BenchSection for m in map(importlib.import_module, (v[0] for v in BENCHMARKS.values()))
                if is_configured(m)]
    assert len(sections) >= 5
    for cls in sections:
        assert (cls.__doc__ or "").strip(), cls
        assert [n for n, f in cls.model_fields.items() if not (f.description or "").strip()] == [], cls


def test_quick_sets_its_keys_beneath_the_command_line():
    """A benchmark's QUICK (here a stand-in module) applies with --quick; a key given wins."""
    import types

    from pydantic import Field

    from tidal.config_section import Section

    class BenchSection(Section):
        """A stand-in benchmark."""

        runs: int = Field(10, ge=1)
        """Runs."""
        rows: int = 4
        """Rows."""

    fake = types.ModuleType("fake_bench")
    fake.BenchSection, fake.READS, fake.run = BenchSection, ("engine",), lambda *a: 0
    fake.QUICK = {"bench.runs": 1, "bench.rows": 2, "engine.max_batch_size": 8}
    bench, cfg, _ = parse(fake, "fake", ["--quick", "--bench.rows", "3"])
    assert (bench.runs, bench.rows, cfg.engine.max_batch_size) == (1, 3, 8)
    assert parse(fake, "fake", [])[0].runs == 10


def test_defaults_lie_beneath_the_recipe_and_the_command_line(tmp_path):
    """A benchmark's DEFAULTS (a stand-in module) set run-config keys the recipe or the command
    line did not; --quick's keys and the command line's win over them."""
    import types

    from tidal.config_section import Section

    class BenchSection(Section):
        """A stand-in benchmark."""

    fake = types.ModuleType("fake_bench")
    fake.BenchSection, fake.READS, fake.run = BenchSection, ("trainer", "engine"), lambda *a: 0
    fake.DEFAULTS = {"trainer.lr": 1e-4, "trainer.warmup_steps": 0, "engine.numerics": "fast"}
    fake.QUICK = {"trainer.warmup_steps": 3}
    recipe = tmp_path / "r.toml"
    recipe.write_text("[trainer]\nlr = 2e-4\n")
    _, cfg, _ = parse(fake, "fake", [])
    assert (cfg.trainer.lr, cfg.trainer.warmup_steps, cfg.engine.numerics) == (1e-4, 0, "fast")
    _, cfg, _ = parse(fake, "fake", [str(recipe), "--quick"])
    assert (cfg.trainer.lr, cfg.trainer.warmup_steps, cfg.engine.numerics) == (2e-4, 3, "fast")
    _, cfg, _ = parse(fake, "fake", [str(recipe), "--trainer.lr", "5e-4", "--engine.numerics", "deterministic"])
    assert (cfg.trainer.lr, cfg.engine.numerics) == (5e-4, "deterministic")


def test_every_benchmark_reads_the_keys_it_sets():
    """Each key of a benchmark's DEFAULTS and QUICK is one it reads (else --help and the JSON's
    config would not show it, and the user's override of it would be noted as unused)."""
    for module in map(importlib.import_module, (v[0] for v in BENCHMARKS.values())):
        keys = {**getattr(module, "DEFAULTS", {}), **getattr(module, "QUICK", {})}
        run_keys = [k for k in keys if not k.startswith("bench.")]
        for key in run_keys:
            assert any(key == r or key.startswith(r + ".") for r in getattr(module, "READS", ())), (module, key)


def test_help_shows_the_benchmarks_defaults(capsys):
    with pytest.raises(SystemExit):
        tidal_main(["bench", "horizon", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--orchestrator.max_staleness 0" in out and "--engine.numerics \"fast\"" in out
    assert "--bench.windows" in out and "--bench.runs_dir" in out
