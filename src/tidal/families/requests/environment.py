"""The "requests" family as a single-turn, instruct-only environment.

reset(task) shows the plain-English request (a chat message); the model's one turn is its answer,
ending at the chat template's end of turn (``stop = []``); step grades the answer's first fenced
code block (else its whole text) with funcs' grader of a one-argument ``f`` against the hidden
tests, and ends the episode: funcs' own environment in its instruct style, on these tasks. It has no mid-training corpus: it measures what a pretrained chat
model can already do.
"""

from __future__ import annotations

from tidal.env.spec import EnvironmentSpec
from tidal.families.funcs import FuncsEnvironment
from tidal.families.requests import tasks
from tidal.families.requests.config import RequestsConfig


def RequestsEnvironment(sandbox) -> FuncsEnvironment:
    """An episode of the family: funcs' environment in its instruct style (the task's
    ``instruction``, the answer's code graded by ``f(x) == y`` on the hidden tests), all or
    nothing."""
    return FuncsEnvironment(sandbox, prompt_style="instruct")


def load_environment(sandbox=None, config: RequestsConfig | None = None) -> EnvironmentSpec:
    """``config``: the validated ``env.args`` (None = the defaults)."""
    cfg = config or RequestsConfig()
    return EnvironmentSpec(
        name="requests",
        make=lambda: RequestsEnvironment(sandbox),
        sample_tasks=lambda n, seed, heldout: tasks.sample_tasks(cfg, n, seed, heldout),
        corpus_version=tasks.GENERATOR_VERSION,
    )
