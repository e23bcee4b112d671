"""Environments by name: ``env.name`` in the config picks one, ``env.args`` configures it.

Lookup order for a name:
  1. ``ENVIRONMENTS`` below (built-ins: name -> module path);
  2. an installed package's entry point in the group ``tidal.environments``
     (``[project.entry-points."tidal.environments"] myenv = "mypkg.myenv"``);
  3. the name itself as an importable module path (``env.name = "mypkg.myenv"``).

The module exposes ``load_environment(...) -> EnvironmentSpec`` and, optionally, ``Config``: a
pydantic model of its settings. ``env.args`` is validated before anything is built: by
``Config`` (the loader then receives the validated model as ``config``), else by the loader's
own signature (each key a keyword argument, checked against its annotation). A bad key or value
is one ``UserError`` naming ``env.args.<key>``, the environment and the settings it accepts.
The loader also receives ``sandbox`` if its signature names it: a ``tidal.sandbox.Sandbox``
for rollouts, or None when tidal only needs tasks or the corpus (the start-up check, dry runs,
mid-training), so building a spec must start nothing costly.
"""

from __future__ import annotations

import importlib
import inspect
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from tidal.env.spec import EnvironmentSpec
from tidal.errors import UserError

ENTRY_POINT_GROUP = "tidal.environments"

ENVIRONMENTS: dict[str, str] = {
    "funcs": "tidal.families.funcs",
    "fixit": "tidal.families.fixit",
    "ledger": "tidal.families.ledger",  # the long-horizon family (horizon engineer)
    "hackable": "tidal.families.hackable",  # the integrity demonstration (issue 13)
    "pyrepo": "tidal.families.pyrepo",
    "requests": "tidal.families.requests",  # plain-English string/list requests (retention check)
    "harness": "tidal.gateway",  # an outside OpenAI-API harness runs each episode (issue 31)
    "agent": "tidal.families.agent",  # examples/harness_agent.py's agent, run natively
}
"""Built-in environments: name -> module exposing load_environment."""


class UnknownEnvironment(UserError, ValueError):
    """env.name names nothing loadable, or its load_environment is not usable."""


class EnvironmentArgsError(UserError, ValueError):
    """env.args holds a key the environment does not accept, or a bad value."""


class NoCorpus(UserError, ValueError):
    """Mid-training needs a corpus, and neither pretrain.corpus nor the environment has one."""


def module_path(name: str) -> str:
    """The module that implements environment ``name`` (see the lookup order above)."""
    if name in ENVIRONMENTS:
        return ENVIRONMENTS[name]
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return ep.value.split(":")[0]
    return name


def import_environment(name: str) -> ModuleType:
    """The module of environment ``name``, with a usable ``load_environment``."""
    path = module_path(name)
    try:
        module = importlib.import_module(path)
    except ModuleNotFoundError as e:
        if e.name is None or not (path == e.name or path.startswith(e.name + ".")):
            raise UnknownEnvironment(f"environment {name!r} ({path}) needs module {e.name!r}, "
                                     "which is not installed") from None
        raise UnknownEnvironment(
            f"env.name {name!r} is not a known environment: use one of {available()}, an entry "
            f"point in the {ENTRY_POINT_GROUP!r} group, or an importable module path"
        ) from None
    if not callable(getattr(module, "load_environment", None)):
        raise UnknownEnvironment(f"module {path!r} (env.name {name!r}) has no load_environment()")
    return module


def available() -> list[str]:
    return sorted(set(ENVIRONMENTS) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def args_model(module: ModuleType) -> type[BaseModel]:
    """The model ``env.args`` is validated by: the module's ``Config``, else one made from
    ``load_environment``'s keyword parameters (``**kwargs`` there accepts any key)."""
    config = getattr(module, "Config", None)
    if isinstance(config, type) and issubclass(config, BaseModel):
        return config
    try:
        params = inspect.signature(module.load_environment, eval_str=True).parameters
    except NameError:  # an annotation names something only a type checker sees
        params = inspect.signature(module.load_environment).parameters
    fields: dict[str, Any] = {}
    extra = "forbid"
    for p in params.values():
        if p.name == "sandbox" or p.kind is p.VAR_POSITIONAL:
            continue
        if p.kind is p.VAR_KEYWORD:
            extra = "allow"
            continue
        annotation = Any if p.annotation is p.empty or isinstance(p.annotation, str) else p.annotation
        fields[p.name] = (annotation, ... if p.default is p.empty else p.default)
    return create_model(f"{module.__name__}.load_environment",
                        __config__=ConfigDict(extra=extra, arbitrary_types_allowed=True), **fields)


def validate_args(name: str, args: dict[str, Any]) -> BaseModel:
    """``args`` (env.args) validated for environment ``name``; EnvironmentArgsError if bad."""
    module = import_environment(name)
    model = args_model(module)
    try:
        return model.model_validate(args)
    except ValidationError as e:
        raise EnvironmentArgsError(_explain(e, name, module, model)) from None


def _explain(err: ValidationError, name: str, module: ModuleType, model: type[BaseModel]) -> str:
    accepted = ", ".join(model.model_fields) or "none"
    lines = []
    for e in err.errors(include_url=False):
        key = ".".join(["env.args", *map(str, e["loc"])])
        if e["type"] == "extra_forbidden":
            lines.append(f"{key} is not a setting")
        else:
            lines.append(f"{key}: {e['msg'].removeprefix('Value error, ')}")
    return (f"{'; '.join(lines)} (environment {name!r}, {module.__name__}; its settings: "
            f"{accepted})")


def load_environment(name: str, sandbox: Any = None, **args: Any) -> EnvironmentSpec:
    """Import environment ``name``, validate ``args`` (its env.args) and build its spec."""
    module = import_environment(name)
    validated = validate_args(name, args)
    loader = module.load_environment
    named = inspect.signature(loader).parameters
    kwargs: dict[str, Any] = {"sandbox": sandbox} if "sandbox" in named else {}
    if validated.__class__ is getattr(module, "Config", None):
        kwargs["config"] = validated
    else:
        kwargs.update({k: getattr(validated, k) for k in validated.__class__.model_fields})
        kwargs.update(validated.model_extra or {})
    spec = loader(**kwargs)
    if not isinstance(spec, EnvironmentSpec):
        raise UnknownEnvironment(f"{module.__name__}.load_environment() returned "
                                 f"{type(spec).__name__}, not an EnvironmentSpec")
    return spec


def from_config(env_cfg: Any, sandbox: Any = None) -> EnvironmentSpec:
    """The environment a run's ``env`` section selects, configured by ``env.args``."""
    return load_environment(env_cfg.name, sandbox=sandbox, **env_cfg.args)


def resolved_args(env_cfg: Any) -> dict[str, Any]:
    """``env.args`` validated, with every default filled in (JSON values): what the
    environment is built with, as the pretrain cache key and ``--dry-run`` show it."""
    return validate_args(env_cfg.name, env_cfg.args).model_dump(mode="json")


def require_corpus(spec: EnvironmentSpec, name: str) -> None:
    """NoCorpus, naming both fixes, if environment ``name`` cannot write a mid-training corpus."""
    if spec.build_corpus is None:
        raise NoCorpus(
            f"environment {name!r} has no mid-training corpus (its EnvironmentSpec has no "
            "build_corpus): set pretrain.corpus to JSONL or text files, or give the environment "
            "a build_corpus(n_docs, seed) (or start RL from a trained model: model.init_from)")


def environment_corpus(env_cfg: Any, n_docs: int, seed: int) -> list[str]:
    """``n_docs`` mid-training documents from the selected environment's ``build_corpus``
    (built without a sandbox)."""
    spec = from_config(env_cfg)
    require_corpus(spec, env_cfg.name)
    return spec.build_corpus(n_docs, seed)
