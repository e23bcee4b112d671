"""Continuous-batching inference over a per-slot KV cache, with hot weight reload.

    submit(req) ──> waiting queue ──(free slot)──> prefill ──> running ──> decode step ... ──> result
                                                   (batched,    (one token for every
                                                   right-padded) running sequence per step)

One ``step()``:
  1. admit waiting requests into free KV-cache slots (FIFO) and prefill them together, right
     padded (pad positions = -1), in forwards of at most ``max_prefill_tokens`` padded tokens;
     each gets its first token from its last prompt position;
  2. one decode forward for every running sequence (each feeds its newest token);
  3. retire finished sequences: eos, a stop string in the decoded tail, max_new_tokens, or the
     slot is full (``max_seq_len`` tokens). Their slots are free for the next step.

Slots: the n running sequences always occupy slots 0..n-1 (admission appends, retirement moves
the highest sequences into the holes: ``_compact``). So a batch's cache rows and per-slot state
are plain slices: the model reads each layer's cached keys/values as a view instead of gathering
[B, kv_heads, kv_len, D] per layer per step (the biggest avoidable copy of a decode step), and the
bookkeeping indexes with slices. A move copies one slot's cache rows once, not every step.

Per-slot state lives in preallocated tensors ([slots, max_seq_len] tokens, logprobs, versions,
experts, and each request's random stream: the token at position p samples with its p-th number,
so a request's draws are its own, whatever it is batched with) so a decode step does a handful of batched tensor ops and no per-token Python work,
except decoding the tail of sequences that have stop strings.

Prefix cache (``prefix_cache``): a finished request's slot keeps its keys/values ("parked").
A new prompt that starts with a parked sequence's tokens takes
that slot and prefills only the rest, at its true positions (the cached forward writes and reads
by position, so this is chunked prefill: bitwise the same as a full one in deterministic mode).
Multi-turn episodes resend their whole context each turn, so a turn costs the prefill of its new
observation instead of the whole context. Parked slots are free slots: admission and compaction
swap rows instead of overwriting them, and a weight update drops them.

Weights: ``load_weights`` copies new weights in place between steps; running sequences keep
their slots and continue, and tokens sampled afterwards record the new version. With
``recompute_kv_on_reload`` the running sequences' KV cache is recomputed under the new weights.
Not thread-safe: call ``submit``/``step``/``load_weights`` from one thread (an actor serialises).

This module holds the step loop and the bookkeeping; slots.py the per-slot tensors and slot
moves, prefill.py the packed (chunked) prefill forward, prefix_cache.py the parked slots.
"""

from __future__ import annotations

from collections import deque

import torch
from torch import nn

from tidal.engine.config import EngineConfig
from tidal.engine.prefill import prefill_forward
from tidal.engine.prefix_cache import PrefixCache
from tidal.engine.request import FinishReason, GenerationRequest, GenerationResult
from tidal.engine.sampling import greedy, sample
from tidal.engine.slots import Batch, RunningSequence, SlotState
from tidal.model.kv_cache import KVCache


class Engine:
    """Continuous-batching sampler over ``cfg.max_batch_size`` KV-cache slots.

    model: a ``tidal.model`` CausalLM (dense or MoE); tokenizer: has ``decode`` and ``eos_id``;
    version: policy version of the model's current weights (recorded on every token).
    """

    def __init__(self, model: nn.Module, tokenizer, cfg: EngineConfig, version: int = 0):
        self.model = model
        self.tokenizer = tokenizer
        self.cfg = cfg
        self._version = version
        mcfg = model.config
        if cfg.max_seq_len > mcfg.max_position_embeddings:
            raise ValueError(
                f"engine.max_seq_len ({cfg.max_seq_len}) exceeds the model's "
                f"max_position_embeddings ({mcfg.max_position_embeddings}); lower engine.max_seq_len"
            )
        self.vocab_size = mcfg.vocab_size
        self.is_moe = mcfg.is_moe
        self.deterministic = cfg.numerics == "deterministic"
        weight = next(model.parameters())
        self.device = weight.device
        slots, length = cfg.max_batch_size, cfg.max_seq_len
        self.cache = KVCache.for_model(mcfg, slots, length, dtype=weight.dtype, device=self.device)
        self._generator = torch.Generator(device=self.device).manual_seed(cfg.seed)
        self._state = SlotState(self.cache, mcfg, slots, length, self.device)
        self._prefix = PrefixCache(self._state, slots)

        self._running: dict[int, RunningSequence] = {}  # slot -> sequence; slots are 0..n-1
        self._waiting: deque[tuple[int, GenerationRequest]] = deque()
        self._batch: Batch | None = None  # None = running set changed, rebuild
        self._next_id = 0
        self._finished_elsewhere: list[GenerationResult] = []  # seen by generate(), not its own
        self.prefill_tokens = 0
        """Prompt tokens prefilled so far."""
        self.cached_tokens = 0
        """Prompt tokens served from parked slots instead (prefix cache hits)."""

    # ---------------------------------------------------------------- public API

    @property
    def version(self) -> int:
        """Policy version of the weights now in use."""
        return self._version

    @property
    def has_work(self) -> bool:
        """True while requests wait, run, or have results not yet returned by ``step``."""
        return bool(self._waiting or self._running or self._finished_elsewhere)

    def submit(self, request: GenerationRequest) -> int:
        """Queue a request; returns its id (unique per engine, increasing)."""
        self._check_prompt(request.prompt_ids)
        request_id = self._next_id
        self._next_id += 1
        self._waiting.append((request_id, request))
        return request_id

    def abort_all(self) -> int:
        """Drop every waiting, running and unreturned request (what a failed rollout left
        behind), so the next caller starts on an empty engine; returns how many were dropped.
        Their slots become free; caches parked for the prefix cache stay valid."""
        dropped = len(self._waiting) + len(self._running) + len(self._finished_elsewhere)
        self._waiting.clear()
        self._running.clear()
        self._finished_elsewhere.clear()
        self._batch = None
        return dropped

    def step(self) -> list[GenerationResult]:
        """Admit + prefill waiting requests, decode one token for all running ones; return the
        requests that finished (in no particular order)."""
        finished, self._finished_elsewhere = self._finished_elsewhere, []
        return finished + self._step()

    def generate(self, requests: list[GenerationRequest],
                 before_step=None) -> list[GenerationResult]:
        """Run ``requests`` to completion; results in request order. Other requests already in
        the engine keep running; those that finish meanwhile are returned by the next ``step``.
        ``before_step()``, if given, runs before every decode step (a rollout worker loads newer
        weights there: in-flight updates)."""
        ids = [self.submit(r) for r in requests]
        wanted = set(ids)
        done: dict[int, GenerationResult] = {}
        while len(done) < len(ids):
            if before_step is not None:
                before_step()
            for result in self._step():
                if result.request_id in wanted:
                    done[result.request_id] = result
                else:
                    self._finished_elsewhere.append(result)
        return [done[i] for i in ids]

    def progress(self, request_ids) -> dict[int, tuple[list[int], list[float]]]:
        """Tokens and sampling logprobs generated so far by the running requests among
        ``request_ids`` (streaming reads this between steps; waiting and finished ones are
        absent). Costs nothing per step: it reads the slot tensors only when called."""
        wanted = set(request_ids)
        out = {}
        for slot, seq in self._running.items():
            if seq.request_id in wanted:
                end = int(self._state.length[slot])
                out[seq.request_id] = (self._state.tokens[slot, seq.prompt_len:end].tolist(),
                                       self._state.logprobs[slot, seq.prompt_len:end].tolist())
        return out

    def load_weights(self, weights: nn.Module | dict[str, torch.Tensor], version: int) -> None:
        """Copy new weights (a model or its state_dict, same architecture) into the engine's model
        in place. In-flight requests continue; their later tokens record ``version``."""
        state = weights.state_dict() if isinstance(weights, nn.Module) else weights
        self.model.load_state_dict(state, strict=True)
        self._version = version
        self._prefix.clear()  # their keys/values are of the old weights
        if self.cfg.recompute_kv_on_reload and self._running:
            with torch.inference_mode():
                # Everything but each sequence's newest token, which the next decode step feeds.
                lengths = (self._state.length[: len(self._running)] - 1).tolist()
                prefill_forward(self.model, self._state, self.cfg, 0, lengths, want_experts=False)

    # ---------------------------------------------------------------- one step

    @torch.inference_mode()
    def _step(self) -> list[GenerationResult]:
        finished = []
        admitted = self._admit()
        if admitted:
            finished += self._prefill(admitted)
        if self._running:
            finished += self._decode()
        return finished

    def _admit(self) -> range:
        """Move waiting requests into the free slots after the running ones; returns the slots
        filled (consecutive). Their per-slot state is written with one tensor op per field."""
        first = len(self._running)
        room = self.cfg.max_batch_size - first
        taken = [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]
        slots = range(first, first + len(taken))
        if not taken:
            return slots
        seqs = [self._sequence(request_id, req) for request_id, req in taken]
        if self.cfg.share_prompts:
            seqs = leaders_first(seqs)
        if self.cfg.prefix_cache:
            for slot, seq in zip(slots, seqs):
                seq.cached = self._prefix.claim(slot, seq.request.prompt_ids, slots.stop)
        self._state.admit(slots, seqs)
        self._running.update(zip(slots, seqs))
        self._batch = None
        return slots

    def _sequence(self, request_id: int, req: GenerationRequest) -> RunningSequence:
        """A request's settings, with the engine defaults filled in."""
        cfg = self.cfg
        prompt_len = len(req.prompt_ids)
        max_new = req.max_new_tokens if req.max_new_tokens is not None else cfg.max_new_tokens
        stop = req.stop if req.stop is not None else list(cfg.stop)
        return RunningSequence(
            request_id, req, prompt_len, stop,
            tail_tokens=max((len(s) for s in stop), default=0) + 4,
            limit=min(prompt_len + max_new, cfg.max_seq_len),
            temperature=req.temperature if req.temperature is not None else cfg.temperature,
            top_p=req.top_p if req.top_p is not None else cfg.top_p,
            seed=req.seed if req.seed is not None else int(torch.randint(
                2**62, (1,), generator=self._generator, device=self.device)),
        )

    def _prefill(self, slots: range) -> list[GenerationResult]:
        """Prefill newly admitted (consecutive) slots and sample each one's first token. With
        share_prompts, slots whose prompt an earlier slot of the wave has (leaders_first put
        them last) copy that slot's keys/values after it is prefilled and prefill one token."""
        seqs = [self._running[s] for s in slots]
        owner = _prompt_owners(seqs) if self.cfg.share_prompts else list(range(len(seqs)))
        split = next((i for i, o in enumerate(owner) if o != i), len(seqs))
        logits, experts = self._prefill_range(range(slots.start, slots.start + split))
        if split < len(seqs):
            for i in range(split, len(seqs)):
                self._copy_prompt(slots.start + owner[i], slots.start + i, seqs[i])
            more = self._prefill_range(range(slots.start + split, slots.stop))
            logits = torch.cat((logits, more[0]))
            experts = None if experts is None else torch.cat((experts, more[1]))
        return self._record(self._make_batch(slots), logits, experts)

    def _prefill_range(self, slots: range):
        """prefill_forward over consecutive slots from each one's cached position."""
        if not slots:
            return torch.empty(0, self.model.config.vocab_size, device=self.device), None
        seqs = [self._running[s] for s in slots]
        lengths = [seq.prompt_len for seq in seqs]
        starts = [seq.cached for seq in seqs]
        self.cached_tokens += sum(starts)
        self.prefill_tokens += sum(lengths) - sum(starts)
        return prefill_forward(self.model, self._state, self.cfg, slots.start, lengths,
                               want_experts=self.is_moe, starts=starts)

    def _copy_prompt(self, src: int, dst: int, seq: RunningSequence) -> None:
        """Slot ``dst`` holds the keys/values (and MoE experts) of slot ``src``'s prompt but its
        last token, which ``dst`` prefills itself."""
        held = seq.prompt_len - 1
        for kc, vc in zip(self.cache.k, self.cache.v):
            kc[dst, :, :held] = kc[src, :, :held]
            vc[dst, :, :held] = vc[src, :, :held]
        if self._state.experts is not None:  # position p's experts sit at index p + 1
            self._state.experts[dst, 1:held + 1] = self._state.experts[src, 1:held + 1]
        seq.cached = held

    def _decode(self) -> list[GenerationResult]:
        """One token for every running sequence."""
        batch = self._batch or self._build_batch()
        positions = (batch.length - 1).unsqueeze(1)  # [B, 1] position of each newest token
        out = self.model(
            batch.tokens.gather(1, positions), positions=positions, cache=self.cache,
            slots=batch.slots, return_experts=self.is_moe, deterministic=self.deterministic,
        )
        logits, experts = out if self.is_moe else (out, None)
        return self._record(batch, logits[:, 0], experts[:, 0] if experts is not None else None)

    def _build_batch(self) -> Batch:
        self._batch = self._make_batch(range(len(self._running)))
        return self._batch

    def _make_batch(self, slots: range) -> Batch:
        """Per-row views of the slot state for consecutive ``slots``."""
        return self._state.batch(slots, [self._running[s] for s in slots])

    # ---------------------------------------------------------------- bookkeeping

    def _record(
        self, batch: Batch, logits: torch.Tensor, experts: torch.Tensor | None
    ) -> list[GenerationResult]:
        """Sample one token per row from logits [B, V] (experts [B, layers, k]: where the router
        went at that position), append it to each slot's sequence; retire those that finished."""
        at = batch.length.unsqueeze(1)  # [B, 1] where each new token goes
        if batch.all_greedy:
            tokens, logprobs = greedy(logits)
        else:
            uniforms = batch.uniforms.gather(1, at).squeeze(1)
            tokens, logprobs = sample(logits, batch.temperature, batch.top_p, uniforms)
        batch.tokens.scatter_(1, at, tokens.unsqueeze(1))
        batch.logprobs.scatter_(1, at, logprobs.unsqueeze(1))
        batch.versions.scatter_(1, at, self._version)
        if experts is not None:
            rows = torch.arange(batch.slots.start, batch.slots.stop, device=self.device)
            self._state.experts[rows, batch.length] = experts.to(torch.int32)
        new_length = batch.length.add_(1)  # a view: updates the slot state in place
        at_limit = new_length >= batch.limit
        if batch.stop_on_eos is None:
            at_eos, ended = None, at_limit
        else:
            at_eos = batch.stop_on_eos & (tokens == self.tokenizer.eos_id)
            ended = at_eos | at_limit
        # Precedence when several hold: eos, then a stop string, then length.
        reasons: dict[int, FinishReason] = {}
        if bool(ended.any()):
            for row in ended.nonzero().flatten().tolist():
                reasons[row] = "eos" if at_eos is not None and bool(at_eos[row]) else "length"
        for row in batch.stop_rows:
            if reasons.get(row) != "eos" and self._tail_has_stop(batch.slots[row]):
                reasons[row] = "stop"
        if not reasons:
            return []
        finished = self._retire({batch.slots[row]: reason for row, reason in reasons.items()})
        self._compact()
        return finished

    def _tail_has_stop(self, slot: int) -> bool:
        """Whether a stop string occurs in the decoded tail of the completion. Earlier text was
        checked on earlier steps, so only the last few tokens can hold a new occurrence."""
        seq = self._running[slot]
        end = int(self._state.length[slot])
        start = max(seq.prompt_len, end - seq.tail_tokens)
        text = self.tokenizer.decode(self._state.tokens[slot, start:end].tolist())
        return any(s in text for s in seq.stop)

    def _retire(self, reasons: dict[int, FinishReason]) -> list[GenerationResult]:
        """Results of the finished slots (slot -> reason), read out with one transfer per field;
        their slots become free."""
        slots = list(reasons)
        state = self._state
        index = torch.tensor(slots, device=self.device)
        ends = state.length[index].tolist()
        width = max(ends)
        tokens = state.tokens[index, :width].tolist()
        logprobs = state.logprobs[index, :width].tolist()
        versions = state.versions[index, :width].tolist()
        experts = state.experts[index, :width].tolist() if state.experts is not None else None
        results = []
        for i, slot in enumerate(slots):
            seq = self._running.pop(slot)
            start, end = seq.prompt_len, ends[i]
            if self.cfg.prefix_cache:
                self._prefix.park(slot, tokens[i][: end - 1])  # the last token was never fed
            token_ids = tokens[i][start:end]
            results.append(GenerationResult(
                request_id=seq.request_id,
                prompt_ids=list(seq.request.prompt_ids),
                token_ids=token_ids,
                logprobs=logprobs[i][start:end],
                versions=versions[i][start:end],
                experts=experts[i][start:end] if experts is not None else None,
                prompt_experts=experts[i][1:start] if experts is not None else None,
                finish_reason=reasons[slot],
                text=self.tokenizer.decode(token_ids),
                tag=seq.request.tag,
            ))
        self._batch = None
        return results

    def _compact(self) -> None:
        """Move the sequences in slots >= n (n running) into the free slots below n, so that the
        running ones are slots 0..n-1 again (see the module docstring for why)."""
        n = len(self._running)
        holes = [slot for slot in range(n) if slot not in self._running]
        if not holes:
            return
        movers = sorted(slot for slot in self._running if slot >= n)
        for src, dst in zip(movers, holes):
            self._running[dst] = self._running.pop(src)
        if self._prefix.holds_any(holes):
            # Swap rather than overwrite: the holes' parked caches move to the movers' old slots.
            self._state.swap(movers, holes)
            self._prefix.relabel(dict(zip(holes, movers)))
            return
        self._state.move(movers, holes)

    def _check_prompt(self, prompt_ids: list[int]) -> None:
        check_prompt(prompt_ids, self.cfg.max_seq_len, self.vocab_size)


def check_prompt(prompt_ids: list[int], max_seq_len: int, vocab_size: int) -> None:
    """ValueError unless an engine of ``max_seq_len`` on a ``vocab_size`` vocabulary can take
    ``prompt_ids`` (a caller that queues requests elsewhere checks them up front with this)."""
    limit = max_seq_len - 1
    if len(prompt_ids) > limit:
        raise ValueError(
            f"prompt has {len(prompt_ids)} tokens but engine.max_seq_len is "
            f"{max_seq_len}, which leaves room for at most {limit}; shorten the "
            f"prompt or raise engine.max_seq_len"
        )
    low, high = min(prompt_ids), max(prompt_ids)
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"prompt token ids must be in [0, {vocab_size}) for this model, "
            f"got ids from {low} to {high}"
        )


def leaders_first(seqs: list[RunningSequence]) -> list[RunningSequence]:
    """The wave's sequences with the first of each prompt (its leader) before every sequence
    whose prompt an earlier one has, each part in arrival order: the followers then sit in one
    consecutive run of slots after their leaders (Engine._prefill)."""
    seen: set[tuple[int, ...]] = set()
    leaders, followers = [], []
    for seq in seqs:
        key = tuple(seq.request.prompt_ids)
        (followers if key in seen else leaders).append(seq)
        seen.add(key)
    return leaders + followers


def _prompt_owners(seqs: list[RunningSequence]) -> list[int]:
    """For each sequence the index of the first one with its prompt (itself if none earlier);
    prompts of a single token have nothing to share and own themselves."""
    first: dict[tuple[int, ...], int] = {}
    owners = []
    for i, seq in enumerate(seqs):
        key = tuple(seq.request.prompt_ids)
        owners.append(first.setdefault(key, i) if seq.prompt_len > 1 else i)
    return owners
