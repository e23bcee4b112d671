"""Environments by name: ``env.name`` in the config picks one.

Lookup order for a name:
  1. ``ENVIRONMENTS`` below (built-ins: name -> module path);
  2. an installed package's entry point in the group ``tidal.environments``
     (``[project.entry-points."tidal.environments"] myenv = "mypkg.myenv"``);
  3. the name itself as an importable module path (``env.name = "mypkg.myenv"``).
The module must expose ``load_environment(**kwargs) -> EnvironmentSpec``. It receives
``sandbox`` (a ``tidal.sandbox.Sandbox`` built from ``env.sandbox``) and ``config`` (the
``EnvConfig``) only if its signature names them, plus every key of ``env.args``.
"""

from __future__ import annotations

import importlib
import inspect
from importlib.metadata import entry_points
from typing import Any

from tidal.env.spec import EnvironmentSpec
from tidal.errors import UserError

ENTRY_POINT_GROUP = "tidal.environments"

ENVIRONMENTS: dict[str, str] = {
    "funcs": "tidal.envs.funcs",
    "fixit": "tidal.envs.fixit",
    "ledger": "tidal.envs.ledger",  # the long-horizon family (horizon engineer)
}
"""Built-in environments: name -> module exposing load_environment."""


class UnknownEnvironment(UserError, ValueError):
    """env.name names nothing loadable, or its load_environment is not usable."""


def module_path(name: str) -> str:
    """The module that implements environment ``name`` (see the lookup order above)."""
    if name in ENVIRONMENTS:
        return ENVIRONMENTS[name]
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return ep.value.split(":")[0]
    return name


def _import(path: str, name: str):
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as e:
        if e.name is None or not (path == e.name or path.startswith(e.name + ".")):
            raise  # the module exists but one of its own imports is missing
        raise UnknownEnvironment(
            f"env.name {name!r} is not a known environment: use one of {available()}, an entry "
            f"point in the {ENTRY_POINT_GROUP!r} group, or an importable module path"
        ) from None


def available() -> list[str]:
    return sorted(set(ENVIRONMENTS) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def load_environment(name: str, sandbox: Any = None, config: Any = None,
                     **kwargs: Any) -> EnvironmentSpec:
    """Import environment ``name`` and call its ``load_environment``."""
    path = module_path(name)
    module = _import(path, name)
    loader = getattr(module, "load_environment", None)
    if loader is None:
        raise UnknownEnvironment(f"module {path!r} (env.name {name!r}) has no load_environment()")
    params = inspect.signature(loader).parameters
    extra = {k: v for k, v in (("sandbox", sandbox), ("config", config)) if k in params}
    spec = loader(**extra, **kwargs)
    if not isinstance(spec, EnvironmentSpec):
        raise UnknownEnvironment(f"{path}.load_environment() returned {type(spec).__name__}, "
                                "not an EnvironmentSpec")
    return spec


def from_config(env_cfg: Any, sandbox: Any) -> EnvironmentSpec:
    """The environment a run's ``env`` section selects, with ``env.args`` as its kwargs."""
    return load_environment(env_cfg.name, sandbox=sandbox, config=env_cfg, **env_cfg.args)
