"""Bringing your own environment: env.args validated by the environment's model (or its
loader's signature) with one clear error, a module that cannot be imported named as such."""

import pytest

from tidal.config import load_config
from tidal.env import EnvironmentArgsError, UnknownEnvironment, from_config, resolved_args
from tidal.errors import UserError

SIGNATURE_ENV = '''
from tidal.env import EnvironmentSpec

def load_environment(sandbox=None, difficulty: int = 1, tag: str = "x") -> EnvironmentSpec:
    return EnvironmentSpec("sig", make=None, sample_tasks=lambda n, s, h: [difficulty] * n)
'''


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """Write a module into a folder on sys.path: ``modules(name, source)``."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(source)
        return name

    return write


def env_cfg(name="funcs", **args):
    return load_config(None, {"env.name": name, "env.args": args}).env


@pytest.mark.parametrize("name", ["funcs", "ledger", "fixit"])
def test_an_unknown_key_names_the_key_the_environment_and_its_settings(name):
    with pytest.raises(EnvironmentArgsError) as err:
        from_config(env_cfg(name, max_levle=2))
    message = str(err.value)
    assert isinstance(err.value, UserError) and "env.args.max_levle is not a setting" in message
    assert f"environment {name!r}" in message and "num_tests" in message  # an accepted field


def test_a_bad_value_and_a_cross_field_error_name_the_key():
    with pytest.raises(EnvironmentArgsError, match=r"env\.args\.max_level: Input should be greater"):
        from_config(env_cfg(max_level=0))
    with pytest.raises(EnvironmentArgsError, match=r"env\.args: min_level \(3\) exceeds max_level \(2\)"):
        from_config(env_cfg(min_level=3, max_level=2))
    with pytest.raises(EnvironmentArgsError, match=r"env\.args\.num_tests: Input should be a valid integer"):
        from_config(env_cfg(num_tests="many"))


def test_resolved_args_fill_in_the_defaults():
    assert resolved_args(env_cfg(max_level=2)) == {**resolved_args(env_cfg()), "max_level": 2}


def test_an_environment_without_a_config_model_is_checked_by_its_signature(modules):
    name = modules("sig_env_one", SIGNATURE_ENV)
    assert from_config(env_cfg(name, difficulty=3)).sample_tasks(2, 0, False) == [3, 3]
    with pytest.raises(EnvironmentArgsError, match=r"env\.args\.difficulty: Input should be a valid integer"):
        from_config(env_cfg(name, difficulty="hard"))
    with pytest.raises(EnvironmentArgsError, match=r"env\.args\.level is not a setting .*difficulty, tag"):
        from_config(env_cfg(name, level=3))


def test_an_environment_whose_dependency_is_missing_says_which(modules):
    name = modules("needs_missing_dep", "import no_such_dependency_xyz\n")
    with pytest.raises(UnknownEnvironment, match="needs module 'no_such_dependency_xyz'"):
        from_config(env_cfg(name))
