"""The ledger family at one context window: tasks long enough to need memory, budgets to match.

    lw = ledger_window(384)                  # LedgerConfig with episodes >= HORIZON windows long
    cfg.env.args = lw.ledger.model_dump()    # the tasks
    cfg.harness  = lw.harness("summarize")   # or "truncate": the family's harness, with budgets

What the long-horizon benchmarks (``tidal bench horizon``, ``tidal bench multiturn``) run at each
window, here so both size the family alike. The file count is measured, not guessed: the
slip-free scripted expert plays probe episodes through the harness (tidal.families.ledger.demos),
and files are added until every probe episode is at least ``horizon`` windows long.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tidal.families.ledger.config import LedgerConfig
from tidal.harness import HarnessConfig
from tidal.trajectory import EpisodeStats

HORIZON = 10.5
"""Default length of the expert's episode, in context windows: when f is written its steps are
this many windows back (10.5: 46 files at window 384, 63 at 512)."""
TOKENS_PER_FILE = 110
"""About how many transcript tokens one file costs (a turn and its observation): the first guess."""
PROBE_TASKS = 8
"""Training-split tasks the expert plays to measure an episode's length."""


@dataclass(frozen=True)
class LedgerWindow:
    """The family's settings at ``window``: the task config, and the harness budgets twice what
    the expert needs (so a looping model is cut off, never a good one)."""

    window: int
    """Context window, tokens."""
    ledger: LedgerConfig
    """The task settings (``env.args``): num_files sized to the horizon, corpus_window = window."""
    expert: list[EpisodeStats]
    """The slip-free expert's probe episodes (summarize mode, training split)."""

    @property
    def max_turns(self) -> int:
        return 2 * max(e.turns for e in self.expert) + 8

    @property
    def max_tokens(self) -> int:
        return 2 * max(e.model_tokens for e in self.expert)

    def harness(self, mode: str) -> HarnessConfig:
        """``harness_for``'s settings in ``mode`` ("summarize" or "truncate") with these budgets."""
        from tidal.families.ledger.demos import harness_for

        return harness_for(self.window, mode, self.max_turns, self.max_tokens, self.ledger.max_ops)


def ledger_window(window: int, horizon: float = HORIZON, base: LedgerConfig | None = None) -> LedgerWindow:
    """``base`` (default: LedgerConfig()) with as many files as make every probe episode of the
    expert at least ``horizon`` windows long at ``window``: scaled from a first guess by the
    measured horizon, then grown until it holds."""
    fields = (base or LedgerConfig()).model_dump()
    files = math.ceil(horizon * window / TOKENS_PER_FILE)
    for _ in range(20):
        cfg = LedgerConfig.model_validate({**fields, "num_files": files, "corpus_window": window})
        probe = expert_episodes(cfg, window)
        low = min(e.effective_horizon for e in probe)
        if low >= horizon:
            return LedgerWindow(window, cfg, probe)
        files = max(files + 1, math.ceil(files * horizon / low))
    raise RuntimeError(f"could not make ledger episodes {horizon} windows long at window {window}")


def expert_episodes(cfg: LedgerConfig, window: int, n: int = PROBE_TASKS) -> list[EpisodeStats]:
    """The slip-free expert's episodes on ``n`` training tasks at ``window``, summarize mode."""
    from tidal.families.ledger.demos import harness_for, play_expert
    from tidal.families.ledger.tasks import sample_tasks

    harness = harness_for(window, "summarize", max_ops=cfg.max_ops)
    return [r.stats() for r in play_expert(sample_tasks(cfg, n, 7, False), window, 0.0, 0, harness)]
