"""tidal.sandbox: run untrusted generated code isolated and limited (threat model: sandbox.py)."""

from tidal.sandbox.config import SandboxConfig
from tidal.sandbox.errors import SandboxError
from tidal.sandbox.image import TaskImage
from tidal.sandbox.rollout import Rollout
from tidal.sandbox.sandbox import GUARANTEES, RunResult, Sandbox

__all__ = ["GUARANTEES", "Rollout", "RunResult", "Sandbox", "SandboxConfig", "SandboxError",
           "TaskImage"]
