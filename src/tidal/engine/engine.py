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
experts) so a decode step does a handful of batched tensor ops and no per-token Python work,
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
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch
from torch import nn

from tidal.engine.config import EngineConfig
from tidal.engine.request import FinishReason, GenerationRequest, GenerationResult
from tidal.engine.sampling import greedy, sample
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
    limit: int  # sequence length at which the slot stops ("length")
    temperature: float
    top_p: float
    cached: int = 0
    """Prompt tokens whose keys/values a parked slot already held (not prefilled)."""

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def stop_on_eos(self) -> bool:
        return not self.request.ignore_eos


@dataclass
class _Batch:
    """The rows of the per-slot state (views) and settings of a consecutive run of slots; the
    decode batch is rebuilt only when the running set changes."""

    slots: range  # consecutive (running sequences are kept in slots 0..n-1)
    tokens: torch.Tensor  # [B, max_seq_len] view of the slots' rows of the engine's state
    logprobs: torch.Tensor  # [B, max_seq_len] view
    versions: torch.Tensor  # [B, max_seq_len] view
    length: torch.Tensor  # [B] view
    temperature: torch.Tensor  # [B]
    all_greedy: bool  # every row has temperature 0: argmax, no sampling machinery
    top_p: torch.Tensor  # [B]
    limit: torch.Tensor  # [B] sequence length at which the slot stops ("length")
    stop_on_eos: torch.Tensor | None  # [B] bool; None when no row stops on eos
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
        self.deterministic = cfg.numerics == "deterministic"
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

        self._running: dict[int, _Sequence] = {}  # slot -> sequence; slots are 0..n-1
        self._waiting: deque[tuple[int, GenerationRequest]] = deque()
        self._batch: _Batch | None = None  # None = running set changed, rebuild
        self._next_id = 0
        self._finished_elsewhere: list[GenerationResult] = []  # seen by generate(), not its own
        self._parked: dict[int, tuple[list[int], list[int]]] = {}
        """Free slot -> the tokens whose keys/values it still holds (a finished sequence but its
        last token, which was never fed) and their block hashes."""
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

    def load_weights(self, weights: nn.Module | dict[str, torch.Tensor], version: int) -> None:
        """Copy new weights (a model or its state_dict, same architecture) into the engine's model
        in place. In-flight requests continue; their later tokens record ``version``."""
        state = weights.state_dict() if isinstance(weights, nn.Module) else weights
        self.model.load_state_dict(state, strict=True)
        self._version = version
        self._parked.clear()  # their keys/values are of the old weights
        if self.cfg.recompute_kv_on_reload and self._running:
            with torch.inference_mode():
                # Everything but each sequence's newest token, which the next decode step feeds.
                lengths = (self._length[: len(self._running)] - 1).tolist()
                self._prefill_forward(0, lengths, want_experts=False)

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
        if self.cfg.prefix_cache:
            for slot, seq in zip(slots, seqs):
                seq.cached = self._claim(slot, seq.request.prompt_ids, slots.stop)
        rows = slice(slots.start, slots.stop)
        width = max(seq.prompt_len for seq in seqs)
        prompts = [seq.request.prompt_ids + [0] * (width - seq.prompt_len) for seq in seqs]
        self._tokens[rows, :width] = torch.tensor(prompts)
        self._length[rows] = torch.tensor([seq.prompt_len for seq in seqs])
        self._limit[rows] = torch.tensor([seq.limit for seq in seqs])
        self._temperature[rows] = torch.tensor([seq.temperature for seq in seqs])
        self._top_p[rows] = torch.tensor([seq.top_p for seq in seqs])
        self._stop_on_eos[rows] = torch.tensor([seq.stop_on_eos for seq in seqs])
        self._running.update(zip(slots, seqs))
        self._batch = None
        return slots

    def _sequence(self, request_id: int, req: GenerationRequest) -> _Sequence:
        """A request's settings, with the engine defaults filled in."""
        cfg = self.cfg
        prompt_len = len(req.prompt_ids)
        max_new = req.max_new_tokens if req.max_new_tokens is not None else cfg.max_new_tokens
        stop = req.stop if req.stop is not None else list(cfg.stop)
        return _Sequence(
            request_id, req, prompt_len, stop,
            tail_tokens=max((len(s) for s in stop), default=0) + 4,
            limit=min(prompt_len + max_new, cfg.max_seq_len),
            temperature=req.temperature if req.temperature is not None else cfg.temperature,
            top_p=req.top_p if req.top_p is not None else cfg.top_p,
        )

    def _prefill(self, slots: range) -> list[GenerationResult]:
        """Prefill newly admitted (consecutive) slots and sample each one's first token."""
        seqs = [self._running[s] for s in slots]
        lengths = [seq.prompt_len for seq in seqs]
        starts = [seq.cached for seq in seqs]
        self.cached_tokens += sum(starts)
        self.prefill_tokens += sum(lengths) - sum(starts)
        logits, experts = self._prefill_forward(slots.start, lengths, want_experts=self.is_moe,
                                                starts=starts)
        return self._record(self._make_batch(slots), logits, experts)

    def _prefill_forward(
        self, first_slot: int, lengths: list[int], want_experts: bool,
        starts: list[int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed ``self._tokens[slot, start:length]`` of slots ``first_slot, first_slot + 1, ...``
        into the cache (``starts``: positions already cached, default 0), in right-padded groups
        of at most ``max_prefill_tokens`` padded tokens.

        Returns the logits [n, V] (and experts [n, layers, k] if asked) at each last position.
        With experts, the routing of every earlier prompt position is recorded too (slot index
        p + 1 holds position p's experts, as for completion tokens), so a trainer can replay the
        whole sequence.
        """
        starts = starts or [0] * len(lengths)
        spans = [n - s for n, s in zip(lengths, starts)]
        last_logits, last_experts = [], []
        for group in _pack(spans, self.cfg.max_prefill_tokens):
            # Groups are consecutive runs of indices, so their slots are a range too.
            slots = range(first_slot + group[0], first_slot + group[-1] + 1)
            group_len = torch.tensor([lengths[i] for i in group], device=self.device)
            group_start = torch.tensor([starts[i] for i in group], device=self.device)
            width = max(spans[i] for i in group)
            steps = torch.arange(width, device=self.device) + group_start.unsqueeze(1)  # [n, width]
            positions = torch.where(steps < group_len.unsqueeze(1), steps, -1)
            rows = slice(slots.start, slots.stop)
            if any(starts[i] for i in group):
                input_ids = self._tokens[rows].gather(1, steps.clamp(max=self.cfg.max_seq_len - 1))
            else:
                input_ids = self._tokens[rows, :width]
            last = group_len - group_start - 1
            out = self.model(
                input_ids, positions=positions, cache=self.cache, slots=slots,
                return_experts=want_experts, logits_at=last, deterministic=self.deterministic,
            )
            logits, experts = out if want_experts else (out, None)
            last_logits.append(logits)
            if experts is not None:
                # Position p's routing goes to index p + 1; padding columns (position -1) land on
                # index 0, which holds nothing.
                slot_rows = torch.arange(slots.start, slots.stop, device=self.device).unsqueeze(1)
                self._experts[slot_rows, positions + 1] = experts.to(torch.int32)
                last_experts.append(experts[torch.arange(len(group), device=self.device), last])
        return torch.cat(last_logits), (torch.cat(last_experts) if last_experts else None)

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

    def _build_batch(self) -> _Batch:
        self._batch = self._make_batch(range(len(self._running)))
        return self._batch

    def _make_batch(self, slots: range) -> _Batch:
        """Per-row views of the slot state for consecutive ``slots``."""
        rows = slice(slots.start, slots.stop)
        seqs = [self._running[s] for s in slots]
        return _Batch(
            slots=slots,
            tokens=self._tokens[rows],
            logprobs=self._logprobs[rows],
            versions=self._versions[rows],
            length=self._length[rows],
            temperature=self._temperature[rows],
            all_greedy=all(seq.greedy for seq in seqs),
            top_p=self._top_p[rows],
            limit=self._limit[rows],
            stop_on_eos=self._stop_on_eos[rows] if any(seq.stop_on_eos for seq in seqs) else None,
            stop_rows=[i for i, seq in enumerate(seqs) if seq.stop],
        )

    # ---------------------------------------------------------------- bookkeeping

    def _record(
        self, batch: _Batch, logits: torch.Tensor, experts: torch.Tensor | None
    ) -> list[GenerationResult]:
        """Sample one token per row from logits [B, V] (experts [B, layers, k]: where the router
        went at that position), append it to each slot's sequence; retire those that finished."""
        if batch.all_greedy:
            tokens, logprobs = greedy(logits)
        else:
            tokens, logprobs = sample(logits, batch.temperature, batch.top_p, self._generator)
        at = batch.length.unsqueeze(1)  # [B, 1] where each new token goes
        batch.tokens.scatter_(1, at, tokens.unsqueeze(1))
        batch.logprobs.scatter_(1, at, logprobs.unsqueeze(1))
        batch.versions.scatter_(1, at, self._version)
        if experts is not None:
            rows = torch.arange(batch.slots.start, batch.slots.stop, device=self.device)
            self._experts[rows, batch.length] = experts.to(torch.int32)
        new_length = batch.length.add_(1)  # a view: updates self._length in place
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
        end = int(self._length[slot])
        start = max(seq.prompt_len, end - seq.tail_tokens)
        text = self.tokenizer.decode(self._tokens[slot, start:end].tolist())
        return any(s in text for s in seq.stop)

    def _retire(self, reasons: dict[int, FinishReason]) -> list[GenerationResult]:
        """Results of the finished slots (slot -> reason), read out with one transfer per field;
        their slots become free."""
        slots = list(reasons)
        index = torch.tensor(slots, device=self.device)
        ends = self._length[index].tolist()
        width = max(ends)
        tokens = self._tokens[index, :width].tolist()
        logprobs = self._logprobs[index, :width].tolist()
        versions = self._versions[index, :width].tolist()
        experts = self._experts[index, :width].tolist() if self._experts is not None else None
        results = []
        for i, slot in enumerate(slots):
            seq = self._running.pop(slot)
            start, end = seq.prompt_len, ends[i]
            if self.cfg.prefix_cache:
                held = tokens[i][: end - 1]  # the last token was never fed
                self._parked[slot] = (held, _block_hashes(held))
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
        if any(hole in self._parked for hole in holes):
            # Swap rather than overwrite: the holes' parked caches move to the movers' old slots.
            self._swap_rows(movers, holes)
            moved = dict(zip(holes, movers))
            self._parked = {moved.get(k, k): v for k, v in self._parked.items()}
            return
        src = torch.tensor(movers, device=self.device)
        dst = torch.tensor(holes, device=self.device)
        for t in self._slot_state():
            t[dst] = t[src]
        held = int(self._length[dst].max())  # cache positions in use by the moved sequences
        for kc, vc in zip(self.cache.k, self.cache.v):
            kc[dst, :, :held] = kc[src, :, :held]
            vc[dst, :, :held] = vc[src, :, :held]

    def _slot_state(self) -> list[torch.Tensor]:
        """Every per-slot tensor (rows indexed by slot)."""
        state = [self._tokens, self._logprobs, self._versions, self._length, self._limit,
                 self._temperature, self._top_p, self._stop_on_eos]
        return state + ([self._experts] if self._experts is not None else [])

    def _swap_rows(self, a: list[int], b: list[int]) -> None:
        """Exchange slots a[i] and b[i]: per-slot state and the cache positions either holds."""
        left = torch.tensor(a + b, device=self.device)
        right = torch.tensor(b + a, device=self.device)
        held = int(self._length[left].max())  # a parked slot's length is its finished sequence's
        for t in self._slot_state():
            t[left] = t[right]  # the right side is gathered (a copy) before the write
        for kc, vc in zip(self.cache.k, self.cache.v):
            kc[left, :, :held] = kc[right, :, :held]
            vc[left, :, :held] = vc[right, :, :held]

    # ---------------------------------------------------------------- prefix cache

    def _claim(self, slot: int, prompt: list[int], admitting_end: int) -> int:
        """Prepare free ``slot`` for ``prompt``: bring the parked slot sharing its longest
        prefix there (swapping rows). Returns how many prompt tokens it already holds (at most
        all but the last, whose logits the first token needs). Slots ``slot..admitting_end-1``
        are being filled now, so a displaced parked cache moves beyond them."""
        if not self._parked:
            return 0
        best, best_blocks = None, 0
        wanted = _block_hashes(prompt)
        for held_slot, (_, hashes) in self._parked.items():
            n = _common_prefix(hashes, wanted)
            if n > best_blocks:
                best, best_blocks = held_slot, n
        best_len = 0
        if best is not None:
            held = self._parked[best][0]
            start = best_blocks * PREFIX_BLOCK
            if held[:start] == prompt[:start]:  # rules out a hash collision
                best_len = start + _common_prefix(held[start: start + PREFIX_BLOCK],
                                                  prompt[start: start + PREFIX_BLOCK])
        best_len = min(best_len, len(prompt) - 1)
        if best_len < PREFIX_BLOCK:
            self._displace(slot, admitting_end)
            return 0
        del self._parked[best]
        if best != slot:
            self._swap_rows([best], [slot])
            displaced = self._parked.pop(slot, None)  # now in best's old rows
            if displaced is not None:
                self._parked[best] = displaced
        return best_len

    def _displace(self, slot: int, admitting_end: int) -> None:
        """``slot`` is about to be overwritten: keep its parked cache in a free slot that holds
        nothing, if there is one, else drop it."""
        held = self._parked.pop(slot, None)
        if held is None:
            return
        for free in range(admitting_end, self.cfg.max_batch_size):
            if free not in self._parked:
                self._swap_rows([slot], [free])
                self._parked[free] = held
                return

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


PREFIX_BLOCK = 16
"""Parked sequences are matched by chained hashes of whole blocks of this many tokens (vLLM's
automatic prefix caching does the same), so a lookup compares a few hashes per parked slot
instead of hundreds of tokens; shorter shared prefixes are prefilled again."""


def _block_hashes(tokens: list[int]) -> list[int]:
    """h[i] = hash of tokens[: (i + 1) * PREFIX_BLOCK] (chained), for every whole block."""
    out, h = [], 0
    for start in range(0, len(tokens) - PREFIX_BLOCK + 1, PREFIX_BLOCK):
        h = hash((h, *tokens[start: start + PREFIX_BLOCK]))
        out.append(h)
    return out


def _common_prefix(a: list, b: list) -> int:
    """Length of the longest common prefix of two lists (slice comparisons run in C)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        mid = (low + high) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid
    return low


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
