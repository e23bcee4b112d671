"""One episode: the multi-turn loop of a model and an environment inside a context window.

    head = reset(task)                       # system text + task; kept across resets
    repeat:
        compact the context if it is full    # summarize: [head, summary]; truncate: [head, tail]
        turn = model(context)                # loss mask 1, logprobs and versions kept
        result = env.step(turn.text)         # tool output / error message
        context += <obs>result</obs>         # loss mask 0: environment tokens are never trained
    until done, or the turn / token budget runs out (env.end(reason) gives the final reward)

The trajectory is a chain of segments, one per context window; each is trained with the episode's
advantage (the trainer's collate repeats a trajectory's advantage on each of its rows). With
``harness.summary_reward = "check"`` the environment also checks each summary against the facts
its context showed (``Environment.check_summary``), and the score, weighted, becomes the dense
reward of the segment the summary closes (``Segment.reward``): credit that reaches that summary's
tokens instead of the one episode advantage spread over every segment.

A task whose head does not fit (with room for a turn and a summary) is skipped, not an error:
the episode ends at once with reason ``PROMPT_TOO_LONG``, reward 0 and no segments, so nothing
of it is trained on and it counts as unsolved (env.end sees the reason; its reward is ignored).

Room rules (W = context window): in summarize mode the context always keeps room for the
summary request and the summary, so a summary can be written in the window it summarises. A
turn may use the rest. An observation that does not fit compacts the context first and opens the
next one (after the head and the summary or kept turns); one too long even there is cut to fit.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from tidal.engine.request import GenerationRequest
from tidal.env.base import Environment, StepResult
from tidal.env.tools import run_blocking
from tidal.harness.chat_format import chat_format
from tidal.harness.config import HarnessConfig
from tidal.harness.seeds import derive_seed
from tidal.harness.segments import SegmentBuilder
from tidal.evidence.records import IntegrityResult
from tidal.plugins import plugins
from tidal.trajectory import EpisodeStats, Segment

SUMMARY_OPEN = "\n<summary>"
"""Written by the harness (loss mask 0) to ask for a summary; the model writes the summary."""
SUMMARY_CLOSE = "</summary>"
"""Ends the model's summary (a stop string); added by the harness if the model did not."""
PROMPT_TOO_LONG = "prompt_too_long"
"""The reason of an episode skipped because its head does not fit the context window."""


@dataclass
class EpisodeResult:
    """An episode's segments, reward and what it cost."""

    segments: list[Segment]
    reward: float
    reason: str
    info: dict[str, Any]
    turns: int = 0
    model_tokens: int = 0
    env_tokens: int = 0
    tool_errors: int = 0
    summary_lengths: list[int] = field(default_factory=list)
    summary_scores: list[float] = field(default_factory=list)
    """The environment's check of each summary (harness.summary_reward = "check"), in order."""
    head_tokens: int = 0
    window: int = 0
    integrity: IntegrityResult | None = None
    """What the detectors found in the environment's evidence (None: it keeps none)."""

    @property
    def resets(self) -> int:
        return max(len(self.segments) - 1, 0)  # an episode skipped before its first segment: 0

    @property
    def transcript_tokens(self) -> int:
        """Tokens of the whole episode counted once: the head plus every completion token."""
        return self.head_tokens + sum(len(s.completion_ids) for s in self.segments)

    @property
    def effective_horizon(self) -> float:
        """Transcript tokens over the context window: > 1 means the episode outgrew its window."""
        return self.transcript_tokens / self.window

    def stats(self) -> EpisodeStats:
        lengths = self.summary_lengths
        return EpisodeStats(
            turns=self.turns, resets=self.resets, effective_horizon=self.effective_horizon,
            transcript_tokens=self.transcript_tokens, summary_count=len(lengths),
            summary_tokens_mean=sum(lengths) / len(lengths) if lengths else 0.0,
            summary_tokens_max=max(lengths, default=0), tool_errors=self.tool_errors,
            model_tokens=self.model_tokens, env_tokens=self.env_tokens)


def check_integrity(env: Environment) -> IntegrityResult | None:
    """The detectors' findings on what the ended episode left behind (``env.evidence()``), with
    the grader's verdicts; None when the environment keeps no evidence. The detectors are the
    installed ``tidal.detectors`` entry points (tidal.plugins; tidal's own: tidal.integrity)."""
    evidence = env.evidence()
    if evidence is None:
        return None
    findings = [f for _, detect in sorted(plugins("tidal.detectors").items())
                for f in detect(evidence)]
    return IntegrityResult(findings, evidence.visible_pass, evidence.hidden_pass, evidence.canary)


class Episode:
    """Runs one environment on one task through an EngineClient; see the module docstring."""

    def __init__(self, env: Environment, client, tokenizer, cfg: HarnessConfig, window: int,
                 max_turn_tokens: int, no_experts: list[list[int]] | None = None, index: int = 0,
                 seed: int | None = None):
        """client: anything with ``async generate(GenerationRequest) -> GenerationResult`` (an
        EngineClient, or a scripted policy); every request's tag is ``(index, "turn")`` or
        ``(index, "summary")``. no_experts: see SegmentBuilder (None for dense models).
        seed: the episode's; its k-th request is seeded derive_seed(seed, k) (None: unseeded)."""
        self.env, self.client, self.tok, self.cfg = env, client, tokenizer, cfg
        self.index, self.seed, self.requests = index, seed, 0
        self.window, self.max_turn_tokens, self.no_experts = window, max_turn_tokens, no_experts
        self.format = chat_format(tokenizer)
        self.obs_open, self.obs_close = self.format.frame
        self.end_of_turn = self.format.end_of_turn
        self.summary_open = self.format.summary_request(SUMMARY_OPEN)
        self.summary_close = tokenizer.encode(SUMMARY_CLOSE)
        self.newline = tokenizer.encode("\n")
        summary_room = (len(self.end_of_turn) + len(self.summary_open) + cfg.summary_max_tokens
                        + len(self.summary_close) + len(self.newline))
        self.reserve = summary_room if cfg.context_mode == "summarize" else 0
        """Tokens kept free at the end of every context (for the summary)."""
        self.head: list[int] = []
        self.segments: list[Segment] = []
        self.seg: SegmentBuilder | None = None
        self.result = EpisodeResult([], 0.0, "", {}, window=window)

    # ------------------------------------------------------------------ the loop

    async def run(self, task: Any) -> EpisodeResult:
        try:
            self.head = self.format.head(await self.env.reset(task))
            self.result.head_tokens = len(self.head)
            if not self._head_fits():
                return await self._skip()
            self.seg = SegmentBuilder(self.head, self.no_experts)
            final = await self._loop()
            # in a thread: detectors parse every changed file, and the other episodes go on
            self.result.integrity = await run_blocking(check_integrity, self.env)
        finally:
            await self.env.close()
        self.segments.append(self.seg.to_segment())
        r = self.result
        r.segments = self.segments
        r.reward += final.reward
        r.reason = str(final.info.get("reason", "done"))
        r.info.update(final.info)
        return r

    async def _loop(self) -> StepResult:
        r = self.result
        while True:
            if r.turns >= self.cfg.max_turns:
                return await self.env.end("turn_budget")
            if self._tokens_left() <= 0:
                return await self.env.end("token_budget")
            if self._needs_compaction():
                if self.cfg.context_mode == "stop" or not await self._compact():
                    return await self.env.end("context")
                if self._tokens_left() <= 0:
                    return await self.env.end("token_budget")
            turn = await self._generate(min(self.max_turn_tokens, self._room()), self.env.stop,
                                        "turn")
            self.seg.add_model(turn, turn=True)
            r.turns += 1
            step = await self._env_step(turn.text)
            if step is None:
                return StepResult("", 0.0, True, {"reason": "step_timeout"})
            r.reward += step.reward
            r.tool_errors += "tool_error" in step.info
            r.info.update(step.info)
            if step.done:
                return StepResult("", 0.0, True, step.info)
            obs = self._observation_ids(step.observation)
            if len(self._closing()) + len(obs) > self._room():
                if self._tokens_left() <= 0:  # no tokens left to summarize with
                    return await self.env.end("token_budget")
                if self.cfg.context_mode == "stop" or not await self._compact():
                    return await self.env.end("context")
            close = self._closing()
            if len(close) + len(self.obs_open) + len(self.obs_close) > self._room():
                return await self.env.end("context")
            self._add_env(close)
            self._add_env(self._fit(obs))

    async def _env_step(self, action: str) -> StepResult | None:
        try:
            return await asyncio.wait_for(self.env.step(action), self.cfg.step_timeout_s)
        except TimeoutError:
            return None

    async def _generate(self, max_new: int, stop: list[str] | None, kind: str):
        max_new = min(max_new, self._tokens_left())
        seed = None if self.seed is None else derive_seed(self.seed, self.requests)
        self.requests += 1
        result = await self.client.generate(GenerationRequest(
            prompt_ids=self.seg.context(), max_new_tokens=max_new, stop=stop,
            tag=(self.index, kind), seed=seed))
        self.result.model_tokens += len(result.token_ids)
        return result

    # ------------------------------------------------------------------ room and budgets

    def _tokens_left(self) -> int:
        return self.cfg.max_tokens - self.result.model_tokens

    def _room(self) -> int:
        """Tokens the context may still grow by (turns and observations)."""
        return self.window - self.reserve - len(self.seg)

    def _needs_compaction(self) -> bool:
        return (len(self.seg) >= self.cfg.summary_trigger * self.window
                or self._room() < self.max_turn_tokens)

    def _head_fits(self) -> bool:
        """Whether the head leaves room for a full turn and a summary in the window."""
        return len(self.head) + self.reserve + self.max_turn_tokens <= self.window

    async def _skip(self) -> EpisodeResult:
        """End an episode whose head does not fit: no segments, reward 0 (see the module
        docstring; ``head_tokens`` says how long the head was)."""
        ended = await self.env.end(PROMPT_TOO_LONG)
        r = self.result
        r.reason = PROMPT_TOO_LONG
        r.info.update(ended.info, reason=PROMPT_TOO_LONG)
        return r

    def _closing(self) -> list[int]:
        """What closes the open assistant turn before the harness writes a message: the chat
        template's end-of-turn token, unless the context already ends with it (the model sampled
        it); nothing for the raw format, whose turns run on."""
        if not self.end_of_turn or self.seg.ends_with(self.end_of_turn):
            return []
        return list(self.end_of_turn)

    def _observation_ids(self, text: str) -> list[int]:
        """``<obs>text</obs>`` with the text cut to max_observation_tokens (cut marked)."""
        ids = self.tok.encode(text)
        limit = self.cfg.max_observation_tokens
        if len(ids) > limit:
            marker = self.tok.encode("...[cut]")
            ids = ids[: max(limit - len(marker), 0)] + marker[:limit]
        return self.obs_open + ids + self.obs_close

    def _fit(self, obs: list[int]) -> list[int]:
        """The observation cut (tags kept) to the room left; unchanged if it fits."""
        room = self._room()
        if len(obs) <= room:
            return obs
        body = obs[len(self.obs_open): len(obs) - len(self.obs_close)]
        keep = max(room - len(self.obs_open) - len(self.obs_close), 0)
        return self.obs_open + body[:keep] + self.obs_close

    def _add_env(self, ids: list[int]) -> None:
        self.seg.add_env(ids)
        self.result.env_tokens += len(ids)

    # ------------------------------------------------------------------ compaction

    async def _compact(self) -> bool:
        """Start a new segment from a summary or the newest turns; False if it cannot help."""
        if self.cfg.context_mode == "summarize":
            carried = await self._summarize()
        else:
            keep = int(self.cfg.truncate_keep * self.window) - len(self.head)
            carried = self.seg.history_tail(keep)
        self.segments.append(self.seg.to_segment())
        self.seg = SegmentBuilder(self.head + carried, self.no_experts)
        return not self._needs_compaction()

    async def _summarize(self) -> list[int]:
        """Ask for a summary (trained in the closing segment); return the next context's
        ``<summary>...</summary>`` block."""
        context = self.seg.context()
        close = self._closing()
        self._add_env(close + self.summary_open)
        summary = await self._generate(self.cfg.summary_max_tokens, [SUMMARY_CLOSE], "summary")
        self.seg.add_model(summary, turn=False)
        self.result.summary_lengths.append(len(summary.token_ids))
        if self.cfg.summary_reward == "check":
            self._check_summary(context, summary.text)
        ids = list(summary.token_ids)
        if SUMMARY_CLOSE not in summary.text:
            ids += self.summary_close
        return close + self.summary_open + ids + self.newline

    def _check_summary(self, context: list[int], summary: str) -> None:
        """The environment's check of the summary as the closing segment's dense reward
        (harness.summary_reward); its score also goes to ``summary_scores``."""
        score = self.env.check_summary(self.tok.decode(context), summary.split(SUMMARY_CLOSE)[0])
        if score is None:
            return
        if not 0.0 <= score <= 1.0:
            raise ValueError(f"{type(self.env).__name__}.check_summary returned {score}; a score "
                             "must lie in [0, 1]")
        self.result.summary_scores.append(score)
        self.seg.reward = self.cfg.summary_reward_coef * score
