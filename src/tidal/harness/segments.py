"""SegmentBuilder: one context window's tokens as they grow, turned into a ``tidal.trajectory.Segment``.

The context the model sees is ``prompt_ids + completion_ids``. Model tokens (loss mask 1) keep
the engine's logprob, version and experts; tokens the harness or environment writes (loss mask
0) get logprob 0.0, version -1 and, for MoE, "no recorded routing" (-1 ids) so the trainer's
router chooses there.
"""

from __future__ import annotations

from tidal.engine.request import GenerationResult
from tidal.trajectory import Segment


class SegmentBuilder:
    def __init__(self, prompt_ids: list[int], no_experts: list[list[int]] | None):
        """no_experts: the expert entry of an environment token ([layers][k] of -1) for MoE
        models, None for dense ones."""
        self.prompt_ids = list(prompt_ids)
        self.completion_ids: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.loss_mask: list[int] = []
        self._no_experts = no_experts
        self.experts: list[list[list[int]]] | None = [] if no_experts is not None else None
        self.prompt_experts: list[list[list[int]]] | None = None
        """MoE: the engine's routing at prompt positions, recorded by the first generation's
        prefill (its prompt is exactly ``prompt_ids``), so the trainer replays it there too."""
        self.turn_starts: list[int] = []
        """Completion offsets where each model turn began (the sliding window cuts there)."""
        self.reward: float | None = None
        """The segment's dense reward (Segment.reward), set when its summary is checked."""

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    def context(self) -> list[int]:
        return self.prompt_ids + self.completion_ids

    def ends_with(self, ids: list[int]) -> bool:
        """Whether the context's last tokens are ``ids`` (without building the context)."""
        n = len(ids)
        if n == 0:
            return True
        tail = self.completion_ids[-n:]
        if len(tail) < n:
            tail = self.prompt_ids[len(tail) - n:] + tail
        return tail == ids

    def add_model(self, result: GenerationResult, turn: bool) -> None:
        """Append a generation (``turn``: it is a model turn, not a summary)."""
        if turn:
            self.turn_starts.append(len(self.completion_ids))
        if not self.completion_ids and result.prompt_experts is not None:
            self.prompt_experts = result.prompt_experts
        self.completion_ids += result.token_ids
        self.logprobs += result.logprobs
        self.versions += result.versions
        self.loss_mask += [1] * len(result.token_ids)
        if self.experts is not None:
            if result.experts is None:
                raise ValueError("an MoE segment got a generation without expert ids")
            self.experts += result.experts

    def add_env(self, ids: list[int]) -> None:
        self.completion_ids += ids
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)
        self.loss_mask += [0] * len(ids)
        if self.experts is not None:
            self.experts += [self._no_experts] * len(ids)

    def history_tail(self, max_tokens: int) -> list[int]:
        """The newest completion tokens, at most ``max_tokens``, starting at a turn boundary when
        one fits (else a plain cut)."""
        n = len(self.completion_ids)
        for start in self.turn_starts:
            if n - start <= max_tokens:
                return self.completion_ids[start:]
        return self.completion_ids[n - max_tokens:] if max_tokens > 0 else []

    def to_segment(self) -> Segment:
        return Segment(self.prompt_ids, self.completion_ids, self.logprobs, self.versions,
                       self.loss_mask, self.experts, prompt_experts=self.prompt_experts,
                       reward=self.reward)
