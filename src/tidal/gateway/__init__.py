"""The rollout gateway: RL through an outside agent harness that speaks the OpenAI API.

``env.name = "harness"`` runs ``env.args.command`` once per episode against an OpenAI-compatible
endpoint served by the rollout's own engine (server.py), builds the trajectory from the tokens the
engine sampled and the chat template's tokens for what the harness added (history.py), and grades
what the harness produced with a task family's environment (episode.py). See docs/harness.md.
"""

from tidal.gateway.config import GatewayConfig
from tidal.gateway.environment import load_environment

Config = GatewayConfig
"""The model of ``env.args`` (tidal.env.registry validates them with it)."""

__all__ = ["Config", "GatewayConfig", "load_environment"]
