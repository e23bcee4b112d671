"""The ``[env]`` section: which environment, its own settings, and how code is run.

Only what every environment shares lives here. An environment's own settings (levels, test
counts, corpus realism...) go in ``env.args``, validated by the environment's config model
(``Config`` in its module, tidal.env.registry) when the run starts.
"""

from typing import Any

from pydantic import model_validator

from tidal.evidence.config import IntegrityConfig
from tidal.config_section import Section
from tidal.sandbox.config import SandboxConfig


class EnvConfig(Section):
    name: str = "funcs"
    """Environment name: a built-in (tidal.env.registry.ENVIRONMENTS), an entry point of the
    "tidal.environments" group, or an importable module path exposing load_environment()."""
    args: dict[str, Any] = {}
    """The environment's own settings, validated by its config model (e.g. the funcs family's
    FuncsConfig: ``env.args.max_level = 2``); {} = its defaults."""
    sandbox: SandboxConfig = SandboxConfig()
    integrity: IntegrityConfig = IntegrityConfig()
    """What findings of cheating do to training, and the canaries (tidal.integrity)."""

    @model_validator(mode="before")
    @classmethod
    def _settings_belong_in_args(cls, data: Any) -> Any:
        """An old recipe's ``env.min_level`` (the funcs family's settings sat in [env] before
        each environment validated its own) gets an error saying where the key goes now."""
        if isinstance(data, dict):
            stray = sorted(k for k in data if k not in cls.model_fields)
            if stray:
                moved = ", ".join(f"env.{k} -> env.args.{k}" for k in stray)
                raise ValueError(
                    f"[env] holds only {', '.join(cls.model_fields)}; an environment's own "
                    f"settings go in env.args: {moved}")
        return data
