"""Where extensions plug into the core: Python entry points, looked up by group, so no core
module imports an extension. tidal's own extensions declare theirs in pyproject.toml's
``[project.entry-points]``; another installed package adds to a group the same way.

    tidal.sections    a run-config section: key -> its Section class        (online)
    tidal.gpu_ops     the GPU op sets: numerics mode -> its Ops class        (kernels)
    tidal.detectors   reward-hacking detectors: name -> (Evidence) -> [Finding]   (integrity)

Entry points are read from the installed package's metadata: `scripts/setup.sh` (its
``pip install -e``) writes them, so a checkout whose pyproject.toml gained one needs set-up
run again.
"""

from __future__ import annotations

import functools
import importlib.metadata
from typing import Any

from tidal.errors import UserError

GROUPS = ("tidal.sections", "tidal.gpu_ops", "tidal.detectors")


class PluginError(UserError):
    """An extension's entry point cannot be loaded; the message names it and the fix."""


@functools.cache
def plugins(group: str) -> dict[str, Any]:
    """Every installed entry point of ``group``, loaded: name -> object."""
    if group not in GROUPS:
        raise ValueError(f"unknown plugin group {group!r}; one of {GROUPS}")
    found: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for ep in importlib.metadata.entry_points(group=group):
        if ep.name in origin and origin[ep.name] != ep.value:
            raise PluginError(f"two extensions register {ep.name!r} in {group}: {origin[ep.name]} "
                              f"and {ep.value}; uninstall one")
        try:
            found[ep.name] = ep.load()
        except (ImportError, AttributeError) as e:
            raise PluginError(f"the {group} entry point {ep.name} = {ep.value!r} cannot be loaded "
                              f"({e}); reinstall the package that declares it (for tidal's own: "
                              "bash scripts/setup.sh)") from None
        origin[ep.name] = ep.value
    return found


def plugin(group: str, name: str, what: str) -> Any:
    """The one entry point ``name`` of ``group``; ``what`` says what needs it, for the error."""
    found = plugins(group)
    if name not in found:
        raise PluginError(f"{what} needs the {group} entry point {name!r}, which no installed "
                          f"package provides (found: {sorted(found) or 'none'}); install tidal "
                          "with its extensions: bash scripts/setup.sh")
    return found[name]
