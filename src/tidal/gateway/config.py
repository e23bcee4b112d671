"""Settings of the rollout gateway's environment (``env.args`` when ``env.name = "harness"``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from tidal.config_section import Section


class GatewayConfig(Section):
    command: str
    """The harness: a command line (split like a shell, no shell features; ``{python}`` is this
    interpreter) run once per episode in a fresh workspace folder, with OPENAI_BASE_URL,
    OPENAI_API_KEY (that episode's key), TIDAL_TASK_FILE and TIDAL_ANSWER_FILE set and the task
    as JSON on stdin. Required."""
    tasks: str = "funcs"
    """The environment family whose tasks the harness is given and whose environment grades the
    answer (env.args of it: ``task_args``)."""
    task_args: dict[str, Any] = Field(default_factory=dict)
    """That family's env.args (e.g. {"prompt_style": "instruct"})."""
    reward: Literal["grade", "harness"] = "grade"
    """grade: the family's environment grades the answer the harness posts to /v1/tidal/answer
    (or leaves in answer.txt in its workspace); harness: the harness posts its own reward to
    /v1/tidal/reward."""
    timeout_s: float = Field(120.0, gt=0)
    """Wall time of one episode; past it the harness's process group is killed (reason
    "timeout")."""
    max_turns: int = Field(8, ge=1)
    """Chat requests per episode; one more ends the episode (reason "turn_budget")."""
    max_tokens: int = Field(2048, ge=1)
    """Tokens the model may generate over the episode; a request with none left ends it
    (reason "token_budget")."""
    max_body_bytes: int = Field(1 << 20, ge=1024)
    """Largest request body the gateway reads (a 413 past it)."""
    corpus_command: str | None = None
    """The harness's own conversations for mid-training (gateway/corpus.py): a command line
    that reads the family's training tasks as JSON lines on stdin and prints {"messages",
    "tools"} lines. None: no corpus (start from a trained model: model.init_from)."""
    preload: list[str] = Field(default_factory=list)
    """Modules a Python harness imports, imported once by a fork server (gateway/zygote.py) that
    forks each episode's harness (the command must start with ``{python}``, this interpreter):
    e.g. ["openai"] saves ~1 s of CPU per episode. Empty: each harness starts afresh."""
    warmup: str = ""
    """Python code the fork server runs once after its ``preload`` imports, before any fork: the
    lazy work every harness would otherwise repeat (a client library's first client builds its
    TLS context and imports its request and response types on first use), e.g.
    ``import openai; openai.OpenAI(api_key="-").chat.completions.create``. An error in it stops
    the run at the first episode, with the fork server's traceback in the run's log."""

    @field_validator("command", "corpus_command")
    @classmethod
    def _command(cls, value: str | None) -> str | None:
        """Split-checked, with arguments naming files here made absolute (the harness runs in
        its own workspace folder, and rollout workers may run elsewhere)."""
        import shlex
        from pathlib import Path

        if value is None:
            return None
        try:
            argv = shlex.split(value)
        except ValueError as e:
            raise ValueError(f"cannot split {value!r} into arguments: {e}") from None
        if not argv:
            raise ValueError("is empty: give the harness's command line, e.g. "
                             "'{python} examples/harness_agent.py'")
        return shlex.join(str(Path(a).resolve()) if not Path(a).is_absolute() and Path(a).is_file()
                          else a for a in argv)
