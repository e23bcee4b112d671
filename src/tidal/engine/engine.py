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

Per-slot state lives in preallocated tensors ([slots, max_seq_len] tokens, logprobs, versions,
experts) so a decode step does a handful of batched tensor ops and no per-token Python work,
except decoding the tail of sequences that have stop strings.

Weights: ``load_weights`` copies new weights in place between steps; running sequences keep
their slots and continue, and tokens sampled afterwards record the new version. With
``recompute_kv_on_reload`` the running sequences' KV cache is recomputed under the new weights.
Not thread-safe: call ``submit``/``step``/``load_weights`` from one thread (an actor serialises).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch
from torch import nn

from tidal.engine.config import EngineConfig
from tidal.engine.request import FinishReason, GenerationRequest, GenerationResult
from tidal.engine.sampling import sample
from tidal.model.kv_cache import KVCache


@dataclass
class _Sequence:
    """Python-side facts about a running request; the per-token data is in the slot tensors."""

    request_id: int
    request: GenerationRequest
    prompt_len: int
    stop: list[str]
    tail_tokens: int
    """Completion tokens decoded to look for a stop string: longest stop string + slack."""


@dataclass
class _Batch:
    """Per-slot values gathered for the running set; rebuilt only when the set changes."""

    slots: torch.Tensor  # [B] int64, ascending
    slot_list: list[int]
    temperature: torch.Tensor  # [B]
    top_p: torch.Tensor  # [B]
    limit: torch.Tensor  # [B] sequence length at which the slot stops ("length")
    stop_on_eos: torch.Tensor  # [B] bool
    stop_rows: list[int]  # rows (indices into slots) of sequences with stop strings


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
        weight = next(model.parameters())
        self.device = weight.device
        slots, length = cfg.max_batch_size, cfg.max_seq_len
        self.cache = KVCache.for_model(mcfg, slots, length, dtype=weight.dtype, device=self.device)
        self._generator = torch.Generator(device=self.device).manual_seed(cfg.seed)

        def zeros(*shape, dtype=torch.long):
            return torch.zeros(shape, dtype=dtype, device=self.device)

        self._tokens = zeros(slots, length)  # prompt + completion of each slot's sequence
        self._logprobs = zeros(slots, length, dtype=torch.float32)  # at completion positions
        self._versions = zeros(slots, length)
        self._experts = (
            zeros(slots, length, mcfg.num_hidden_layers, mcfg.num_experts_per_tok, dtype=torch.int32)
            if self.is_moe else None
        )
        self._length = zeros(slots)  # tokens held (prompt + generated)
        self._limit = zeros(slots)
        self._temperature = zeros(slots, dtype=torch.float32)
        self._top_p = zeros(slots, dtype=torch.float32)
        self._stop_on_eos = zeros(slots, dtype=torch.bool)

        self._running: dict[int, _Sequence] = {}  # slot -> sequence
        self._free: list[int] = list(range(slots))
        self._waiting: deque[tuple[int, GenerationRequest]] = deque()
        self._batch: _Batch | None = None  # None = running set changed, rebuild
        self._next_id = 0
        self._finished_elsewhere: list[GenerationResult] = []  # seen by generate(), not its own

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

    def step(self) -> list[GenerationResult]:
        """Admit + prefill waiting requests, decode one token for all running ones; return the
        requests that finished (in no particular order)."""
        finished, self._finished_elsewhere = self._finished_elsewhere, []
        return finished + self._step()

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Run ``requests`` to completion; results in request order. Other requests already in
        the engine keep running; those that finish meanwhile are returned by the next ``step``."""
        ids = [self.submit(r) for r in requests]
        wanted = set(ids)
        done: dict[int, GenerationResult] = {}
        while len(done) < len(ids):
            for result in self._step():
                if result.request_id in wanted:
                    done[result.request_id] = result
                else:
                    self._finished_elsewhere.append(result)
        return [done[i] for i in ids]

    def load_weights(self, weights: nn.Module | dict[str, torch.Tensor], version: int) -> None:
        """Copy new weights (a model or its state_dict, same architecture) into the engine's model
        in place. In-flight requests continue; their later tokens record ``version``."""
        state = weights.state_dict() if isinstance(weights, nn.Module) else weights
        self.model.load_state_dict(state, strict=True)
        self._version = version
        if self.cfg.recompute_kv_on_reload and self._running:
            with torch.inference_mode():
                slots = sorted(self._running)
                # Everything but each sequence's newest token, which the next decode step feeds.
                lengths = [int(self._length[s]) - 1 for s in slots]
                self._prefill_forward(slots, lengths, want_experts=False)

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

    def _admit(self) -> list[int]:
        """Move waiting requests into free slots (lowest first); returns the slots filled."""
        admitted = []
        self._free.sort()
        while self._waiting and self._free:
            request_id, req = self._waiting.popleft()
            slot = self._free.pop(0)
            self._start(slot, request_id, req)
            admitted.append(slot)
        if admitted:
            self._batch = None
        return admitted

    def _start(self, slot: int, request_id: int, req: GenerationRequest) -> None:
        cfg = self.cfg
        prompt_len = len(req.prompt_ids)
        max_new = req.max_new_tokens if req.max_new_tokens is not None else cfg.max_new_tokens
        stop = req.stop if req.stop is not None else list(cfg.stop)
        self._tokens[slot, :prompt_len] = torch.tensor(req.prompt_ids, dtype=torch.long)
        self._length[slot] = prompt_len
        self._limit[slot] = min(prompt_len + max_new, cfg.max_seq_len)
        self._temperature[slot] = req.temperature if req.temperature is not None else cfg.temperature
        self._top_p[slot] = req.top_p if req.top_p is not None else cfg.top_p
        self._stop_on_eos[slot] = not req.ignore_eos
        tail = max((len(s) for s in stop), default=0) + 4
        self._running[slot] = _Sequence(request_id, req, prompt_len, stop, tail)

    def _prefill(self, slots: list[int]) -> list[GenerationResult]:
        """Prefill newly admitted sequences and sample each one's first token."""
        lengths = [self._running[s].prompt_len for s in slots]
        logits, experts = self._prefill_forward(slots, lengths, want_experts=self.is_moe)
        index = torch.tensor(slots, device=self.device)
        tokens, logprobs = sample(logits, self._temperature[index], self._top_p[index], self._generator)
        stop_rows = [i for i, s in enumerate(slots) if self._running[s].stop]
        return self._record(
            index, slots, tokens, logprobs, experts,
            self._limit[index], self._stop_on_eos[index], stop_rows,
        )

    def _prefill_forward(
        self, slots: list[int], lengths: list[int], want_experts: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed ``self._tokens[slot, :length]`` of each slot into the cache, in right-padded
        groups of at most ``max_prefill_tokens`` padded tokens.

        Returns the logits [n, V] (and experts [n, layers, k] if asked) at each last position.
        """
        last_logits, last_experts = [], []
        for group in _pack(lengths, self.cfg.max_prefill_tokens):
            group_slots = torch.tensor([slots[i] for i in group], device=self.device)
            group_len = torch.tensor([lengths[i] for i in group], device=self.device)
            width = int(group_len.max())
            steps = torch.arange(width, device=self.device)
            positions = torch.where(steps < group_len.unsqueeze(1), steps, -1)  # [n, width]
            input_ids = self._tokens[group_slots, :width]
            out = self.model(
                input_ids, positions=positions, cache=self.cache, slots=group_slots,
                return_experts=want_experts,
            )
            logits, experts = out if want_experts else (out, None)
            rows = torch.arange(len(group), device=self.device)
            last_logits.append(logits[rows, group_len - 1])
            if experts is not None:
                last_experts.append(experts[rows, group_len - 1])
        # Groups are consecutive runs of indices, so concatenating keeps the input order.
        return torch.cat(last_logits), (torch.cat(last_experts) if last_experts else None)

    def _decode(self) -> list[GenerationResult]:
        """One token for every running sequence."""
        batch = self._batch or self._build_batch()
        positions = self._length[batch.slots] - 1  # [B] position of each newest token
        input_ids = self._tokens[batch.slots, positions]
        out = self.model(
            input_ids.unsqueeze(1), positions=positions.unsqueeze(1), cache=self.cache,
            slots=batch.slots, return_experts=self.is_moe,
        )
        logits, experts = out if self.is_moe else (out, None)
        tokens, logprobs = sample(logits[:, 0], batch.temperature, batch.top_p, self._generator)
        return self._record(
            batch.slots, batch.slot_list, tokens, logprobs,
            experts[:, 0] if experts is not None else None,
            batch.limit, batch.stop_on_eos, batch.stop_rows,
        )

    def _build_batch(self) -> _Batch:
        slot_list = sorted(self._running)
        slots = torch.tensor(slot_list, device=self.device)
        self._batch = _Batch(
            slots=slots,
            slot_list=slot_list,
            temperature=self._temperature[slots],
            top_p=self._top_p[slots],
            limit=self._limit[slots],
            stop_on_eos=self._stop_on_eos[slots],
            stop_rows=[i for i, s in enumerate(slot_list) if self._running[s].stop],
        )
        return self._batch

    # ---------------------------------------------------------------- bookkeeping

    def _record(
        self,
        slots: torch.Tensor,
        slot_list: list[int],
        tokens: torch.Tensor,
        logprobs: torch.Tensor,
        experts: torch.Tensor | None,
        limit: torch.Tensor,
        stop_on_eos: torch.Tensor,
        stop_rows: list[int],
    ) -> list[GenerationResult]:
        """Append one sampled token to each slot's sequence; retire those that finished."""
        positions = self._length[slots]
        self._tokens[slots, positions] = tokens
        self._logprobs[slots, positions] = logprobs
        self._versions[slots, positions] = self._version
        if experts is not None:
            self._experts[slots, positions] = experts.to(torch.int32)
        new_length = positions + 1
        self._length[slots] = new_length
        at_eos = stop_on_eos & (tokens == self.tokenizer.eos_id)
        at_limit = new_length >= limit
        # Precedence when several hold: eos, then a stop string, then length.
        reasons: dict[int, FinishReason] = {}
        ended = at_eos | at_limit
        if bool(ended.any()):
            for row in ended.nonzero().flatten().tolist():
                reasons[row] = "eos" if bool(at_eos[row]) else "length"
        for row in stop_rows:
            if reasons.get(row) != "eos" and self._tail_has_stop(slot_list[row]):
                reasons[row] = "stop"
        return [self._retire(slot_list[row], reason) for row, reason in reasons.items()]

    def _tail_has_stop(self, slot: int) -> bool:
        """Whether a stop string occurs in the decoded tail of the completion. Earlier text was
        checked on earlier steps, so only the last few tokens can hold a new occurrence."""
        seq = self._running[slot]
        end = int(self._length[slot])
        start = max(seq.prompt_len, end - seq.tail_tokens)
        text = self.tokenizer.decode(self._tokens[slot, start:end].tolist())
        return any(s in text for s in seq.stop)

    def _retire(self, slot: int, reason: FinishReason) -> GenerationResult:
        seq = self._running.pop(slot)
        self._free.append(slot)
        self._batch = None
        start, end = seq.prompt_len, int(self._length[slot])
        token_ids = self._tokens[slot, start:end].tolist()
        return GenerationResult(
            request_id=seq.request_id,
            prompt_ids=list(seq.request.prompt_ids),
            token_ids=token_ids,
            logprobs=self._logprobs[slot, start:end].tolist(),
            versions=self._versions[slot, start:end].tolist(),
            experts=self._experts[slot, start:end].tolist() if self._experts is not None else None,
            finish_reason=reason,
            text=self.tokenizer.decode(token_ids),
            tag=seq.request.tag,
        )

    def _check_prompt(self, prompt_ids: list[int]) -> None:
        limit = self.cfg.max_seq_len - 1
        if len(prompt_ids) > limit:
            raise ValueError(
                f"prompt has {len(prompt_ids)} tokens but engine.max_seq_len is "
                f"{self.cfg.max_seq_len}, which leaves room for at most {limit}; shorten the "
                f"prompt or raise engine.max_seq_len"
            )
        low, high = min(prompt_ids), max(prompt_ids)
        if low < 0 or high >= self.vocab_size:
            raise ValueError(
                f"prompt token ids must be in [0, {self.vocab_size}) for this model, "
                f"got ids from {low} to {high}"
            )


def _pack(lengths: list[int], budget: int) -> list[list[int]]:
    """Split indices 0..n-1 into consecutive groups whose padded size (count x longest) stays
    within ``budget``; a single over-budget item forms a group alone."""
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i, n in enumerate(lengths):
        if current and (len(current) + 1) * max(longest, n) > budget:
            groups.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        groups.append(current)
    return groups
