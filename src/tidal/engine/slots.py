"""The engine's per-slot state: preallocated [slots, max_seq_len] tensors beside the KV cache,
the Python-side facts of a running request, and the batch views a forward reads and writes.

A slot's row holds one sequence (prompt + completion) and what was recorded for it; the engine
keeps its running sequences in slots 0..n-1 (see engine.py), so a batch is a slice of rows. Moving
or swapping slots moves their rows of every tensor here and of the KV cache together.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tidal.engine.request import GenerationRequest
from tidal.engine.sampling import request_stream
from tidal.model.kv_cache import KVCache


@dataclass
class RunningSequence:
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
    seed: int
    """The seed of the request's random stream (GenerationRequest.seed, or drawn by the engine)."""
    cached: int = 0
    """Prompt tokens whose keys/values a parked slot already held (not prefilled)."""

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def stop_on_eos(self) -> bool:
        return not self.request.ignore_eos


@dataclass
class Batch:
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
    uniforms: torch.Tensor  # [B, max_seq_len] view: each request's random stream, by position
    limit: torch.Tensor  # [B] sequence length at which the slot stops ("length")
    stop_on_eos: torch.Tensor | None  # [B] bool; None when no row stops on eos
    stop_rows: list[int]  # rows (indices into slots) of sequences with stop strings


class SlotState:
    """Per-slot tensors (rows indexed by slot) for ``slots`` sequences of up to ``length``
    tokens, and the KV cache whose rows are the same slots. model_cfg: the model's config (for
    the MoE expert shape)."""

    def __init__(self, cache: KVCache, model_cfg, slots: int, length: int, device: torch.device):
        self.cache = cache
        self.device = device

        def zeros(*shape, dtype=torch.long):
            return torch.zeros(shape, dtype=dtype, device=device)

        self.tokens = zeros(slots, length)  # prompt + completion of each slot's sequence
        self.logprobs = zeros(slots, length, dtype=torch.float32)  # at completion positions
        self.versions = zeros(slots, length)
        self.uniforms = zeros(slots, length, dtype=torch.float32)  # each request's own stream
        self.experts = (
            zeros(slots, length, model_cfg.num_hidden_layers, model_cfg.num_experts_per_tok,
                  dtype=torch.int32)
            if model_cfg.is_moe else None
        )
        self.length = zeros(slots)  # tokens held (prompt + generated)
        self.limit = zeros(slots)
        self.temperature = zeros(slots, dtype=torch.float32)
        self.top_p = zeros(slots, dtype=torch.float32)
        self.stop_on_eos = zeros(slots, dtype=torch.bool)

    def admit(self, slots: range, seqs: list[RunningSequence]) -> None:
        """Write newly admitted sequences' prompts and settings into consecutive ``slots``, one
        tensor op per field."""
        rows = slice(slots.start, slots.stop)
        width = max(seq.prompt_len for seq in seqs)
        prompts = [seq.request.prompt_ids + [0] * (width - seq.prompt_len) for seq in seqs]
        self.tokens[rows, :width] = torch.tensor(prompts)
        self.length[rows] = torch.tensor([seq.prompt_len for seq in seqs])
        self.limit[rows] = torch.tensor([seq.limit for seq in seqs])
        self.temperature[rows] = torch.tensor([seq.temperature for seq in seqs])
        self.top_p[rows] = torch.tensor([seq.top_p for seq in seqs])
        streams = [request_stream(seq.seed, self.uniforms.shape[1]) for seq in seqs]
        self.uniforms[rows] = torch.stack(streams).to(self.device)
        self.stop_on_eos[rows] = torch.tensor([seq.stop_on_eos for seq in seqs])

    def batch(self, slots: range, seqs: list[RunningSequence]) -> Batch:
        """Per-row views of the slot state for consecutive ``slots`` (running ``seqs``)."""
        rows = slice(slots.start, slots.stop)
        return Batch(
            slots=slots,
            tokens=self.tokens[rows],
            logprobs=self.logprobs[rows],
            versions=self.versions[rows],
            length=self.length[rows],
            temperature=self.temperature[rows],
            all_greedy=all(seq.greedy for seq in seqs),
            top_p=self.top_p[rows],
            uniforms=self.uniforms[rows],
            limit=self.limit[rows],
            stop_on_eos=self.stop_on_eos[rows] if any(seq.stop_on_eos for seq in seqs) else None,
            stop_rows=[i for i, seq in enumerate(seqs) if seq.stop],
        )

    def tensors(self) -> list[torch.Tensor]:
        """Every per-slot tensor (rows indexed by slot)."""
        state = [self.tokens, self.logprobs, self.versions, self.uniforms, self.length,
                 self.limit, self.temperature, self.top_p, self.stop_on_eos]
        return state + ([self.experts] if self.experts is not None else [])

    def move(self, src: list[int], dst: list[int]) -> None:
        """Copy slots src[i] into dst[i]: per-slot state and the cache positions in use (the
        source slots are left as they were)."""
        src_index = torch.tensor(src, device=self.device)
        dst_index = torch.tensor(dst, device=self.device)
        for t in self.tensors():
            t[dst_index] = t[src_index]
        held = int(self.length[dst_index].max())  # cache positions in use by the moved sequences
        for kc, vc in zip(self.cache.k, self.cache.v):
            kc[dst_index, :, :held] = kc[src_index, :, :held]
            vc[dst_index, :, :held] = vc[src_index, :, :held]

    def swap(self, a: list[int], b: list[int]) -> None:
        """Exchange slots a[i] and b[i]: per-slot state and the cache positions either holds."""
        left = torch.tensor(a + b, device=self.device)
        right = torch.tensor(b + a, device=self.device)
        held = int(self.length[left].max())  # a parked slot's length is its finished sequence's
        for t in self.tensors():
            t[left] = t[right]  # the right side is gathered (a copy) before the write
        for kc, vc in zip(self.cache.k, self.cache.v):
            kc[left, :, :held] = kc[right, :, :held]
            vc[left, :, :held] = vc[right, :, :held]
