"""Demonstrations of the ledger family, in exactly the harness's token format (mid-training corpus).

The scripted expert plays through the harness's own ``Episode`` loop in place of the engine:
``ExpertClient`` answers each generation request (a turn, or a summary once the context fills)
from what the request's context shows, as a model would. So a demonstration is the chain of
segments the harness builds — head, ``<call>``s, ``<obs>``ervations, ``<summary>`` requests and
summaries, resets — token for token, with no second copy of the format to drift out of step.

What the expert knows is only its context: the summary carried into it (believed, even when a
slip garbled it) and the files shown since. When asked for a summary it writes the code of f
found so far ("x*=5;x+=7"); with probability ``summary_slip_rate`` that summary drops or garbles a step, and
the episode then ends with a wrong f, so the mid-trained model keeps facts only most of the time
and RL has something to fix.

Mid-training rows: one per segment (the context window the model saw), padded to a fixed length,
with the segment's own loss mask: only the expert's turns and summaries are trained on, exactly
as RL trains the model's. (Trained on, the harness-written ``<summary>`` block that follows the
head in every later context would be what the model writes where its first turn begins; and a
row cut through a segment would teach it to act without the summary it was given.)
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable

import torch

from tidal.engine import EngineConfig
from tidal.env import OBS_CLOSE, OBS_OPEN, Rubric, format_call
from tidal.families.ledger import tasks as family
from tidal.families.ledger.config import LedgerConfig
from tidal.families.ledger.environment import NO_MORE_FILES, LedgerEnvironment, read_context
from tidal.families.ledger.tasks import LedgerTask
from tidal.harness import (SUMMARY_CLOSE, SUMMARY_OPEN, Episode, GenerationRequest,
                           GenerationResult, HarnessConfig)
from tidal.model import ByteTokenizer
from tidal.trajectory import Segment

class ExpertClient:
    """Stands in for the engine client of one episode: the expert answers from the context."""

    def __init__(self, tokenizer, rng: random.Random, slip_rate: float):
        self.tok = tokenizer
        self.expert = family.LedgerExpert(rng, slip_rate)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        context = self.tok.decode(request.prompt_ids)
        if context.endswith(SUMMARY_OPEN):
            text = self.summary(context) + SUMMARY_CLOSE
        else:
            text = self.turn(context)
        ids = self.tok.encode(text)[: request.max_new_tokens]
        return GenerationResult(request_id=0, prompt_ids=request.prompt_ids, token_ids=ids,
                                logprobs=[0.0] * len(ids), versions=[0] * len(ids), experts=None,
                                finish_reason="stop", text=self.tok.decode(ids))

    def turn(self, context: str) -> str:
        if context.endswith(OBS_OPEN + NO_MORE_FILES + OBS_CLOSE):
            code = self.expert.answer(self.expert.recall(*read_context(context)))
            return format_call("submit", {"code": code})
        return format_call("next_file", {})

    def summary(self, context: str) -> str:
        memory = self.expert.recall(*read_context(context[: -len(SUMMARY_OPEN)]))  # minus the request
        return self.expert.summarize(memory)


def _matches_reference(task: LedgerTask, env: LedgerEnvironment) -> float:
    """Demonstrations are scored without the sandbox: the expert's code is right iff it is the
    reference text (it writes steps only in the reference's form)."""
    return float(env.submitted == task.reference_solution)


def harness_for(window: int, mode: str, max_turns: int = 10_000, max_tokens: int = 1_000_000,
                max_ops: int = 2) -> HarnessConfig:
    """The harness settings of the ledger family at ``window``: room for exactly the longest
    submit turn and the longest summary of ``max_ops`` steps. Every token of room kept free
    beyond those is window lost to each segment, and more segments mean more summaries that
    must carry the facts."""
    code = family.longest_code(max_ops)
    return HarnessConfig(context_window=window, context_mode=mode, summary_trigger=0.95,
                         summary_max_tokens=len(code) + len(SUMMARY_CLOSE), truncate_keep=0.5,
                         max_turns=max_turns, max_tokens=max_tokens,
                         max_turn_tokens=len(format_call("submit", {"code": code})),
                         max_observation_tokens=128)


def demo_harness(window: int, harness: HarnessConfig | None = None) -> HarnessConfig:
    """The harness settings of a demonstration at ``window``: the given ones (None: the
    defaults in summarize mode) with turn and token budgets that never cut the expert short."""
    base = harness or HarnessConfig(context_mode="summarize")
    return base.model_copy(update={"context_window": window, "max_turns": 10_000,
                                   "max_tokens": 1_000_000})


async def _play(task: LedgerTask, cfg: HarnessConfig, rng: random.Random, slip_rate: float, env):
    tok = ByteTokenizer()
    max_turn = cfg.max_turn_tokens or EngineConfig().max_new_tokens  # as run_episodes decides
    episode = Episode(env, ExpertClient(tok, rng, slip_rate), tok, cfg, cfg.context_window, max_turn)
    return await episode.run(task)


def play_expert(tasks: Iterable[LedgerTask], window: int, slip_rate: float, seed: int,
                harness: HarnessConfig | None = None, env=None) -> list:
    """The expert's episode (an ``EpisodeResult``) on each task, at context window ``window``.
    ``env``: makes the environment (default: the ledger environment scored without the
    sandbox; pass an EnvironmentSpec's ``make`` to grade as the model is graded)."""
    cfg = demo_harness(window, harness)
    rng = random.Random(f"ledger-expert-{seed}")
    make = env or (lambda: LedgerEnvironment(None, Rubric([(_matches_reference, 1.0)])))

    async def all_of_them():
        return [await _play(t, cfg, rng, slip_rate, make()) for t in tasks]

    return asyncio.run(all_of_them())


def segment_text(segment: Segment) -> str:
    """The segment's context as text (without the bos token)."""
    return ByteTokenizer().decode(segment.prompt_ids + segment.completion_ids)


def demo_rows(segments: list[Segment], seq_len: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mid-training rows: ids [N, seq_len] (each segment's prompt + completion, padded with
    ``pad_id``) and loss_mask [N, seq_len] (1 at the tokens the expert wrote)."""
    ids = torch.full((len(segments), seq_len), pad_id, dtype=torch.long)
    mask = torch.zeros(len(segments), seq_len)
    for i, seg in enumerate(segments):
        tokens = seg.prompt_ids + seg.completion_ids
        if len(tokens) > seq_len:
            raise ValueError(f"a segment of {len(tokens)} tokens does not fit pretrain.seq_len {seq_len}")
        ids[i, : len(tokens)] = torch.tensor(tokens)
        mask[i, len(seg.prompt_ids): len(tokens)] = torch.tensor(seg.loss_mask, dtype=torch.float32)
    return ids, mask


def informative(segment: Segment) -> bool:
    """Whether the segment holds a decision beyond copying: a step to add to the summary, or
    the submission."""
    text = ByteTokenizer().decode(segment.completion_ids)
    return family.STEP_MARK in text or '"submit"' in text


def demo_segments(cfg: LedgerConfig, window: int, n_episodes: int, seed: int,
                  harness: HarnessConfig | None = None) -> list[Segment]:
    """Segments of ``n_episodes`` expert episodes on training-split tasks at ``window`` (with the
    expert's summary slips), shuffled: every informative one and as many of the others (which
    only copy the summary on), each episode's first included. Most segments of an episode only
    copy; kept in full they would leave the steps that matter ~1 row in 10."""
    rng = random.Random(seed)
    tasks = family.sample_tasks(cfg, n_episodes, seed + 1_000_003, heldout=False)
    results = play_expert(tasks, window, cfg.summary_slip_rate, seed, harness)
    kept, others = [], []
    for r in results:
        for i, seg in enumerate(r.segments):
            (kept if i == 0 or informative(seg) else others).append(seg)
    segments = kept + rng.sample(others, min(len(others), len(kept)))
    rng.shuffle(segments)
    return segments


DOCS_PER_EPISODE = 4
"""About how many segments demo_segments keeps per episode, at the least (a first guess of how
many episodes n_docs documents need)."""


def demo_documents(cfg: LedgerConfig, n_docs: int, seed: int) -> list[str]:
    """``n_docs`` documents for the environment's build_corpus: demo_segments' segments at
    ``cfg.corpus_window`` (``harness_for``'s settings in summarize mode), each as text. Packed
    documents train on every token; ``demo_rows`` keeps only the expert's (the horizon bench)."""
    harness = harness_for(cfg.corpus_window, "summarize", max_ops=cfg.max_ops)
    docs: list[str] = []
    while len(docs) < n_docs:
        episodes = -(-(n_docs - len(docs)) // DOCS_PER_EPISODE)
        segments = demo_segments(cfg, cfg.corpus_window, episodes, seed + 7919 * len(docs), harness)
        docs += [segment_text(s) for s in segments]
    return docs[:n_docs]
