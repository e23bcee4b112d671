"""tidal.sandbox: run untrusted generated code isolated and limited (threat model: sandbox.py)."""

from tidal.sandbox.config import SandboxConfig
from tidal.sandbox.errors import SandboxError
from tidal.sandbox.files import TRUNCATED, changed_protected
from tidal.sandbox.image import TaskImage
from tidal.sandbox.pyenv import PythonEnv, build_python_env
from tidal.sandbox.rollout import Rollout
from tidal.sandbox.sandbox import GUARANTEES, RunResult, Sandbox

__all__ = ["GUARANTEES", "TRUNCATED", "PythonEnv", "Rollout", "RunResult", "Sandbox",
           "SandboxConfig", "SandboxError", "TaskImage", "build_python_env", "changed_protected"]
