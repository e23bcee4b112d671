"""Settings of the "pyrepo" family (``env.args`` when ``env.name = "pyrepo"``)."""

from pydantic import Field, model_validator

from tidal.config_section import Section


class PyrepoConfig(Section):
    levels: tuple[int, int] = (1, 3)
    """Fewest and most operations composed in f (inclusive), as the funcs family's levels."""
    num_visible: int = Field(3, ge=1, le=10)
    """Cases in the visible test file tests/test_ops.py (the agent reads and runs it)."""
    num_hidden: int = Field(8, ge=1, le=40)
    """Cases in the hidden test file, on other inputs (graded after the episode, never in the
    agent's workspace)."""
    wrong_body_rate: float = Field(0.5, ge=0.0, le=1.0)
    """The chance that f's body is a wrong implementation (one step slipped, as funcs' hurried
    programmer writes it) rather than missing (``raise NotImplementedError``)."""
    heldout_buckets: int = Field(10, ge=2)
    """1 in this many specs (by funcs' hash of the spec) is held out."""
    env_cache_dir: str = ""
    """Where the pytest Python env is built and kept; "" = the sandbox's ``env_cache_dir``."""
    max_test_output_chars: int = Field(1500, ge=200)
    """run_tests shows the last this many characters of pytest's output (its summary)."""

    @model_validator(mode="after")
    def _check(self) -> "PyrepoConfig":
        low, high = self.levels
        if not 1 <= low <= high:
            raise ValueError(f"levels must be [min, max] with 1 <= min <= max, got {list(self.levels)}")
        return self
