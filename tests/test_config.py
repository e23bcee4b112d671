"""Config loading: TOML, dotted overrides, unknown keys, cross-field checks, --dry-run."""

import pytest

from tidal.cli import main
from tidal.config.loader import split_overrides
from tidal.config import ConfigError, TidalConfig, load_config, parse_overrides
from tidal.config_section import Section


def _fields(cls, prefix=""):
    """Every leaf field of a config class as (dotted name, FieldInfo)."""
    for name, info in cls.model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, Section):
            yield from _fields(info.annotation, f"{prefix}{name}.")
        else:
            yield prefix + name, info


def test_every_config_field_is_documented():
    """Each field's docstring is its documentation (`--dry-run`, docs): none may lack one."""
    missing = [name for name, info in _fields(TidalConfig) if not (info.description or "").strip()]
    assert missing == []


def test_defaults_round_trip_through_the_dry_run_recipe(tmp_path, capsys):
    """The recipe `--dry-run` prints for the defaults loads back to the same config."""
    assert main(["train", "--dry-run"]) == 0
    p = tmp_path / "defaults.toml"
    p.write_text(capsys.readouterr().out)
    assert load_config(p) == load_config()


def test_toml_and_overrides(tmp_path):
    p = tmp_path / "r.toml"
    p.write_text("[trainer]\nlr = 0.01\n[env.sandbox]\ntimeout_s = 3.0\n")
    cfg = load_config(p, ["--trainer.lr", "1e-6", '--engine.stop=["\\n"]', "--orchestrator.steps", "7"])
    assert cfg.trainer.lr == 1e-6
    assert cfg.env.sandbox.timeout_s == 3.0
    assert cfg.engine.stop == ["\n"]
    assert cfg.orchestrator.steps == 7


def test_unknown_key_is_named(tmp_path):
    with pytest.raises(ConfigError, match="trainer.lrr"):
        load_config(None, ["--trainer.lrr", "1"])
    p = tmp_path / "r.toml"
    p.write_text("[modle]\nhidden_size = 8\n")
    with pytest.raises(ConfigError, match="modle"):
        load_config(p)


def test_a_moved_key_names_its_new_place(tmp_path):
    with pytest.raises(ConfigError, match=r"'orchestrator.seed' moved to 'run.seed'.*--run.seed"):
        load_config(None, ["--orchestrator.seed", "3"])
    p = tmp_path / "old.toml"
    p.write_text("[pretrain]\nnum_threads = 1\n")
    with pytest.raises(ConfigError, match=r"'pretrain.num_threads' moved to 'run.pretrain_threads'"):
        load_config(p)
    assert load_config(None, ["--run.seed", "3", "--run.trainer_threads", "1"]).run.seed == 3


def test_a_moved_section_names_its_new_place(tmp_path):
    with pytest.raises(ConfigError, match=r"\[trainer.sharding\] is now a section of its own.*--sharding.<key>"):
        load_config(None, ["--trainer.sharding.processes", "2"])
    p = tmp_path / "old.toml"
    p.write_text("[trainer.sharding]\nprocesses = 2\n")
    with pytest.raises(ConfigError, match=r"write it as \[sharding\]"):
        load_config(p)
    assert load_config(None, ["--sharding.processes", "2"]).sharding.processes == 2


def test_bad_values_and_cross_field():
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        load_config(None, ["--model.num_key_value_heads", "4"])
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        load_config(None, ["--engine.max_seq_len", "4096"])
    with pytest.raises(ConfigError, match="trainer.lr"):
        load_config(None, ["--trainer.lr", "-1"])


def test_bad_toml_and_missing_file(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("[trainer\nlr=")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(p)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml")


def test_parse_overrides_errors():
    with pytest.raises(ConfigError, match="needs a value"):
        parse_overrides(["--trainer.lr"])
    with pytest.raises(ConfigError, match="section"):
        parse_overrides(["--lr", "1"])


def test_split_overrides_keeps_positional_config():
    known, over = split_overrides(["r.toml", "--trainer.lr", "1e-6", "--dry-run", "--engine.top_p=0.9"])
    assert known == ["r.toml", "--dry-run"]
    assert over == ["--trainer.lr", "1e-6", "--engine.top_p=0.9"]


def test_dry_run_prints_resolved_config_that_round_trips(tmp_path, capsys):
    assert main(["train", "--dry-run", "--trainer.lr", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "lr = 0.5" in out and "[env.sandbox]" in out
    p = tmp_path / "resolved.toml"
    p.write_text(out)
    assert load_config(p) == load_config(None, ["--trainer.lr", "0.5"])


def test_cli_bad_config_exits_2_with_message(capsys):
    assert main(["train", "--trainer.lrr", "1"]) == 2
    assert "unknown config key 'trainer.lrr'" in capsys.readouterr().err


def test_an_old_recipes_env_settings_are_told_to_move_to_env_args(tmp_path):
    p = tmp_path / "old.toml"
    p.write_text("[env]\nmin_level = 2\nmax_level = 3\n")
    with pytest.raises(ConfigError, match=r"env\.max_level -> env\.args\.max_level, "
                                          r"env\.min_level -> env\.args\.min_level"):
        load_config(p)


def test_dry_run_loads_the_environment_and_fails_on_a_bad_one(capsys):
    assert main(["train", "--dry-run", "--env.name", "no_such_env"]) == 2
    err = capsys.readouterr().err
    assert "env.name 'no_such_env' is not a known environment" in err and err.count("\n") == 1
    assert main(["pretrain", "--dry-run", "--env.args.max_levle", "2"]) == 2
    assert "env.args.max_levle is not a setting" in capsys.readouterr().err
    assert main(["train", "--dry-run", "--env.args.max_level", "2"]) == 0
    out = capsys.readouterr().out
    assert "# env: funcs (tidal.families.funcs), args {" in out and '"max_level": 2' in out


def test_train_checks_the_environment_before_mid_training(tmp_path, monkeypatch, capsys):
    import tidal.pretrain.cache

    def must_not_run(*a, **k):
        raise AssertionError("mid-training started before the environment was checked")

    monkeypatch.setattr(tidal.pretrain.cache, "cached_pretrained", must_not_run)
    run_dir = tmp_path / "run"
    assert main(["train", "--run-dir", str(run_dir), "--env.name", "ledgr"]) == 2
    assert "ledgr" in capsys.readouterr().err and not run_dir.exists()


# --- shipped recipes, and a checkpoint fixing [model]'s architecture ---------------------------

def test_a_shipped_recipe_is_found_by_name():
    from tidal.config.loader import recipe_path

    assert recipe_path("smollm2").name == "smollm2.toml"
    with pytest.raises(ConfigError, match="smollm2"):
        recipe_path("no-such-recipe")


def test_init_from_fixes_the_architecture(tmp_path):
    from tidal.model import build_model, preset, save_pretrained
    from tidal.model.checkpoint import CheckpointError

    save_pretrained(build_model(preset("tiny-llama"), seed=0), tmp_path / "ckpt")
    cfg = load_config(None, ["--model.init_from", str(tmp_path / "ckpt")])
    assert cfg.model.qk_norm is False and cfg.model.rope_theta == 100000.0
    assert cfg.model.init_from == str(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="model.hidden_size = 64"):
        load_config(None, ["--model.init_from", str(tmp_path / "ckpt"), "--model.hidden_size", "64"])
