"""The agent loop's budgets and its context management (self-summarization or a sliding window)."""

from typing import Literal

from pydantic import Field

from tidal.config_section import Section


class HarnessConfig(Section):
    context_window: int = Field(0, ge=0)
    """Tokens one context may hold (head + turns + observations + a summary); 0 = engine.max_seq_len.
    Must not exceed engine.max_seq_len."""
    context_mode: Literal["summarize", "truncate", "stop"] = "stop"
    """What happens when the context fills: "summarize" = the model writes a summary and the next
    context is [head, summary] (room for the summary is kept free in every context);
    "truncate" = a sliding window keeps [head, latest turns]; "stop" = the episode ends (reason
    "context"). "stop" is the default because single-turn tasks (funcs) never fill a window and
    then lose no room to a summary reserve."""
    summary_trigger: float = Field(0.75, gt=0.0, le=1.0)
    """Compact the context once it holds this fraction of the window (or sooner if a full turn,
    max_turn_tokens, would not fit)."""
    summary_max_tokens: int = Field(64, ge=1)
    """Longest summary the model may write, tokens (room for it is always kept free)."""
    summary_reward: Literal["off", "check"] = "off"
    """A dense reward for each summary (summarize mode): "check" = the environment's check of the
    summary against the facts its context showed (``Environment.check_summary``, a score in
    [0, 1]), times summary_reward_coef, is attached to the segment the summary closes
    (``Segment.reward``), so the trainer credits that summary's tokens beside the episode's
    advantage (trainer.grpo.segment_advantages). "off" = summaries are trained by the episode's
    reward only. Environments without a check attach nothing either way."""
    summary_reward_coef: float = Field(1.0, ge=0)
    """Weight of the summary check's score in a segment's advantage, advantage units per unit of
    score (the episode's advantage is about 1 in size: group-normalised). The ledger family's
    check drops by 1/n for each of n facts a summary gets wrong."""
    truncate_keep: float = Field(0.5, gt=0.0, lt=1.0)
    """Sliding window: after a cut the context holds at most this fraction of the window (the
    head plus the newest whole turns that fit)."""
    max_turns: int = Field(16, ge=1)
    """Model turns per episode (malformed tool calls count); then the episode ends
    ("turn_budget")."""
    max_tokens: int = Field(4096, ge=1)
    """Model-generated tokens per episode, summaries included; then the episode ends
    ("token_budget")."""
    max_turn_tokens: int = Field(0, ge=0)
    """Longest model turn, tokens; 0 = engine.max_new_tokens. The context is compacted before a
    turn when less room than this is left, so the window never cuts a turn short: set it to the
    longest turn the task needs, not more."""
    max_observation_tokens: int = Field(128, ge=1)
    """Longest observation shown to the model, tokens (longer ones are cut, marked as cut);
    room for one is always kept free after a turn."""
    step_timeout_s: float = Field(60.0, gt=0)
    """An environment step taking longer ends the episode (reason "step_timeout", reward 0):
    a hung environment must not hang the worker."""
    max_concurrent_episodes: int = Field(0, ge=0)
    """Episodes in flight at once in one worker (each holds an environment); 0 = all of them."""
