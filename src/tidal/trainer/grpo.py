"""GRPO building blocks as pure functions: advantages, collation, token logprobs, the clipped loss.

Nothing here holds state or touches an optimizer, so each piece is unit-tested by hand.

Alignment convention (shared with the engine). A segment is ``prompt_ids + completion_ids``
(``n`` tokens). The model reads ``input_ids = seq[:-1]`` and position ``t`` predicts
``targets[t] = seq[t + 1]``. Completion token ``j`` therefore sits at target position
``t = len(prompt_ids) + j - 1``: its old logprob, its loss-mask bit and, for MoE, its recorded
experts all land on row position ``t``. The engine records for completion token ``j`` the experts
of the forward pass that *sampled* it, i.e. the routing of input position ``t`` — the same
position, so router replay lines up without any shifting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from tidal.numerics.ops import scaled_log_softmax
from tidal.trainer.stats import LossStats
from tidal.trajectory import Segment, Trajectory

LossAgg = Literal["token_mean", "seq_mean"]

NO_REPLAY = -1
"""Expert id meaning "no recorded routing here; let the router choose" (prompt positions)."""


def group_advantages(
    rewards: torch.Tensor | list[float],
    group_ids: torch.Tensor | list[int],
    normalize_std: bool,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO advantage: reward minus its group's mean, optionally over the group's std (+ eps).

    The std is the unbiased sample std (as in TRL / DeepSeekMath). A group whose rewards are all
    equal carries no learning signal and gets exactly 0 (not 0/eps noise). Returns float32 [N].
    """
    r = torch.as_tensor(rewards, dtype=torch.float64)
    g = torch.as_tensor(group_ids)
    if r.shape != g.shape or r.dim() != 1:
        raise ValueError(f"rewards {tuple(r.shape)} and group_ids {tuple(g.shape)} must be equal 1-D shapes")
    adv = torch.zeros_like(r)
    for gid in torch.unique(g):
        idx = g == gid
        rg = r[idx]
        if bool((rg == rg[0]).all()):
            continue
        centred = rg - rg.mean()
        if normalize_std:
            centred = centred / (rg.std(unbiased=True) + eps)
        adv[idx] = centred
    return adv.float()


PER_ROW = ("advantages", "row_traj", "lengths", "prompt_lengths")
"""TrainBatch fields with one value per row (the others are [B, T, ...])."""


@dataclass
class TrainBatch:
    """Padded tensors for one trainer step; one row per segment. B rows, T = longest row.

    input_ids [B,T] long: the segment's tokens minus the last, right-padded with pad_id.
    targets [B,T] long: input_ids shifted by one (targets[t] = seq[t+1]); pad_id past the end.
    loss_mask [B,T] float: 1 only where targets[t] is a completion token with Segment.loss_mask 1.
    old_logprobs [B,T] float: behaviour-policy sampling logprob of targets[t] (0 where masked).
    advantages [B] float: the trajectory's advantage, repeated for each of its segments (plus
        the segment's centred dense reward where it carries one, see segment_advantages).
    experts [B,T,L,k] long or None: recorded routing per input position (NO_REPLAY elsewhere).
    row_traj [B] long: index of the trajectory each row came from.
    lengths [B] long: real (unpadded) positions per row.
    versions [B,T] long: policy version that sampled targets[t] (-1 where loss_mask is 0).
    prompt_lengths [B] long: the segment's prompt tokens (its first completion token is predicted
        at position prompt_lengths - 1); rows with equal prompts share them (trainer/shared_prefix.py).
    """

    input_ids: torch.Tensor
    targets: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    experts: torch.Tensor | None
    row_traj: torch.Tensor
    lengths: torch.Tensor
    versions: torch.Tensor
    prompt_lengths: torch.Tensor

    @property
    def num_rows(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device | str) -> "TrainBatch":
        """The same batch with every tensor on ``device``."""
        return TrainBatch(**{
            name: None if t is None else t.to(device) for name, t in vars(self).items()
        })

    def select(self, index: torch.Tensor) -> "TrainBatch":
        """The rows at ``index`` [n] long, in that order, at the batch's full width."""
        return TrainBatch(**{name: None if t is None else t[index] for name, t in vars(self).items()})

    def rows(self, start: int, stop: int) -> "TrainBatch":
        """Rows [start, stop), trimmed to their own longest row (less padding per micro-batch)."""
        cut = slice(start, stop)
        length = max(int(self.lengths[cut].max().item()), 1)
        per_row = PER_ROW
        return TrainBatch(**{
            name: None if t is None else t[cut] if name in per_row else t[cut, :length]
            for name, t in vars(self).items()
        })


def segment_advantages(trajectories: list[Trajectory], rows: list[tuple[int, Segment]],
                       advantages: torch.Tensor) -> torch.Tensor:
    """Per-row advantage [B]: the trajectory's advantage plus its segment's dense reward
    (``Segment.reward``) minus the mean dense reward of the segments at the same index in the
    same group (those that carry one); rows without a dense reward keep the trajectory's.

    Turn-level credit as MT-GRPO does it (Zeng et al. 2025, "Reinforcing Multi-Turn Reasoning in
    LLM Agents via Turn-Level Credit Assignment", arXiv 2505.11821; its verl port's
    ``compute_grpo_outcome_advantage`` with turn rewards): advantage of a turn = outcome
    advantage + lambda * group-relative turn reward. Here lambda is folded into the reward by
    whoever attached it (harness.summary_reward_coef), and the turn reward is centred but not
    divided by its std, so a small miss gets a small push. Centring per index compares each
    summary with the summaries the group wrote at the same point of the task.
    """
    row_traj = torch.tensor([i for i, _ in rows], dtype=torch.long)
    adv = torch.as_tensor(advantages, dtype=torch.float32)[row_traj]
    keys = [(trajectories[i].group_id, _index_of(trajectories[i], s)) for i, s in rows]
    by_key: dict[tuple[int, int], list[float]] = {}
    for key, (_, s) in zip(keys, rows):
        if s.reward is not None:
            by_key.setdefault(key, []).append(s.reward)
    dense = [0.0 if s.reward is None else s.reward - sum(by_key[key]) / len(by_key[key])
             for key, (_, s) in zip(keys, rows)]
    return adv + torch.tensor(dense, dtype=torch.float64).float()


def _index_of(trajectory: Trajectory, segment: Segment) -> int:
    """The segment's position in its trajectory (by identity)."""
    return next(k for k, s in enumerate(trajectory.segments) if s is segment)


def collate(
    trajectories: list[Trajectory],
    pad_id: int,
    normalize_std: bool = True,
    advantages: torch.Tensor | None = None,
    segment_rewards: bool = True,
) -> TrainBatch:
    """Pad every segment of every trajectory into one TrainBatch (see the module alignment note).

    ``advantages`` [num_trajectories]: None = group_advantages of the trajectories' rewards and
    group ids (with ``normalize_std``); pass your own for another estimator.
    ``segment_rewards``: add segments' dense rewards to their rows (segment_advantages); a batch
    whose segments carry none (every batch unless harness.summary_reward is on) is the same
    either way; False = every row gets its trajectory's advantage, whatever the segments say.
    Segments with fewer than 2 tokens have nothing to predict and are skipped.
    """
    if advantages is None:
        advantages = group_advantages(
            [t.reward for t in trajectories], [t.group_id for t in trajectories], normalize_std
        )
    if len(advantages) != len(trajectories):
        raise ValueError(f"{len(advantages)} advantages for {len(trajectories)} trajectories")
    rows = _trainable_segments(trajectories)
    B = len(rows)
    T = max(len(s.prompt_ids) + len(s.completion_ids) - 1 for _, s in rows)
    row_traj = torch.tensor([i for i, _ in rows], dtype=torch.long)
    batch = TrainBatch(
        input_ids=torch.full((B, T), pad_id, dtype=torch.long),
        targets=torch.full((B, T), pad_id, dtype=torch.long),
        loss_mask=torch.zeros(B, T),
        old_logprobs=torch.zeros(B, T),
        advantages=(segment_advantages(trajectories, rows, advantages) if segment_rewards
                    else torch.as_tensor(advantages, dtype=torch.float32)[row_traj]),
        experts=_expert_buffer([s for _, s in rows], B, T),
        row_traj=row_traj,
        lengths=torch.tensor([len(s.prompt_ids) + len(s.completion_ids) - 1 for _, s in rows]),
        versions=torch.full((B, T), -1, dtype=torch.long),
        prompt_lengths=torch.tensor([len(s.prompt_ids) for _, s in rows], dtype=torch.long),
    )
    for b, (_, s) in enumerate(rows):
        _fill_row(batch, b, s)
    return batch


def _trainable_segments(trajectories: list[Trajectory]) -> list[tuple[int, Segment]]:
    """(trajectory index, segment) of every segment with 2 or more tokens; checks that there is
    one and that all or none carry MoE experts."""
    rows = [(i, s) for i, t in enumerate(trajectories) for s in t.segments
            if len(s.prompt_ids) + len(s.completion_ids) >= 2]
    if not rows:
        raise ValueError("collate: no segment has 2 or more tokens; nothing to train on")
    has_experts = [s.experts is not None for _, s in rows]
    if any(has_experts) and not all(has_experts):
        raise ValueError("collate: some segments carry MoE experts and some do not; "
                         "all segments of a batch must come from the same kind of model")
    return rows


def _expert_buffer(segments: list[Segment], B: int, T: int) -> torch.Tensor | None:
    """[B, T, layers, k] of NO_REPLAY for MoE segments (shape from one with >= 1 token's
    experts); None for dense ones or when no segment recorded any."""
    shaped = next((s for s in segments if s.experts), None)
    if shaped is None or not all(s.experts is not None for s in segments):
        return None
    L, k = len(shaped.experts[0]), len(shaped.experts[0][0])
    return torch.full((B, T, L, k), NO_REPLAY, dtype=torch.long)


def _fill_row(batch: TrainBatch, b: int, s: Segment) -> None:
    """Write segment ``s`` into row ``b`` of ``batch`` (see the module alignment note)."""
    seq = torch.tensor(s.prompt_ids + s.completion_ids, dtype=torch.long)
    n, P, C = len(seq), len(s.prompt_ids), len(s.completion_ids)
    batch.input_ids[b, : n - 1] = seq[:-1]
    batch.targets[b, : n - 1] = seq[1:]
    if C == 0:
        return
    # Completion token j is target position P + j - 1; with an empty prompt, j = 0 has no
    # position (nothing precedes it) and is dropped.
    first = 1 if P == 0 else 0
    pos = slice(P + first - 1, P + C - 1)
    batch.loss_mask[b, pos] = torch.tensor(s.loss_mask[first:], dtype=torch.float32)
    mask = batch.loss_mask[b, pos]
    batch.old_logprobs[b, pos] = torch.tensor(s.logprobs[first:], dtype=torch.float32) * mask
    trained = mask > 0
    batch.versions[b, pos] = torch.where(trained, torch.tensor(s.versions[first:]), -1)
    experts = batch.experts
    if experts is not None and s.prompt_experts:
        experts[b, : len(s.prompt_experts)] = _expert_tensor(s.prompt_experts, experts)
    if experts is not None and len(s.experts) > first:
        experts[b, pos] = _expert_tensor(s.experts[first:], experts)


def _expert_tensor(ids: list[list[list[int]]], like: torch.Tensor) -> torch.Tensor:
    """Recorded expert ids [n][layers][k] as a tensor, checked against the batch's [*, layers, k]."""
    e = torch.tensor(ids, dtype=torch.long)
    if e.shape[1:] != like.shape[2:]:
        raise ValueError(f"collate: segment experts have shape [*, {e.shape[1]}, {e.shape[2]}], "
                         f"expected [*, {like.shape[2]}, {like.shape[3]}]")
    return e


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) at each target: [B,T,V], [B,T] -> [B,T] float32.

    Matches the engine's recorded sampling logprob: the same op (tidal.numerics.ops), so with the
    deterministic forward the two are bitwise equal. Temperature 0 (greedy) is scored as T = 1,
    the distribution the greedy choice was taken from.
    """
    t = temperature if temperature > 0 else 1.0
    logp = scaled_log_softmax(logits, t)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def loss_weights(mask: torch.Tensor, agg: LossAgg, num_units: float | None = None) -> torch.Tensor:
    """Per-token weights [B,T] so that sum(weights * per_token_loss) is the aggregated loss.

    token_mean: 1 / (tokens in the whole batch). seq_mean: 1 / (tokens in the row) / (rows with
    at least one token in the whole batch). ``num_units`` is that whole-batch count (tokens or
    rows); None = this call's own, so micro-batches each pass the full batch's count and their
    losses add up to the one-big-batch loss.
    """
    mask = mask.float()
    if agg == "token_mean":
        units = mask.sum().item() if num_units is None else num_units
        return mask / max(units, 1.0)
    if agg == "seq_mean":
        per_row = mask.sum(dim=1, keepdim=True)
        units = (per_row > 0).sum().item() if num_units is None else num_units
        return mask / per_row.clamp(min=1.0) / max(units, 1.0)
    raise ValueError(f"unknown loss aggregation {agg!r}; use 'token_mean' or 'seq_mean'")


def ppo_clip_loss(
    new_lp: torch.Tensor,
    old_lp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    agg: LossAgg,
    kl_coef: float = 0.0,
    num_units: float | None = None,
    prox_lp: torch.Tensor | None = None,
    token_weight: torch.Tensor | None = None,
    dual_clip: float = 0.0,
    ref_lp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """PPO-clip policy-gradient loss against the behaviour policy, with a decoupled clip range.

    Per token: ratio = exp(new - old); pg = -min(ratio * A, clip(ratio, 1 - low, 1 + high) * A);
    k3 = ratio - 1 - log(ratio) (estimates KL(behaviour || current), samples are behaviour's);
    loss = pg + kl_coef * k3, aggregated by ``agg`` (see loss_weights).

    Decoupled PPO (off-policy corrections, trainer/offpolicy.py): with ``prox_lp`` the ratio is
    exp(new - prox) instead, and ``token_weight`` [B,T] (rho) multiplies each token's pg term; k3
    stays against the behaviour policy ``old_lp``.

    Dual-clip (Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep RL"): with
    ``dual_clip`` c > 1, a token with A < 0 contributes at most -c * A, so a huge ratio on a bad
    sample (a policy drifting into tokens the behaviour policy rarely chose) cannot dominate the
    step. KL to a reference: with ``ref_lp`` (a frozen reference policy's logprobs, e.g. the
    model RL began from) k3 is exp(ref - new) - 1 - (ref - new), the estimator of
    KL(current || reference) GRPO uses (DeepSeekMath), instead of the one to the behaviour policy.

    new_lp, old_lp, mask: [B,T]; adv: [B]. Returns (loss, LossStats): token means over the
    masked tokens (clip_frac, kl, ratio_mean) plus ratio_max, pg_loss, and tokens; a
    micro-batch's means can be combined weighting by ``tokens``.
    """
    mask = mask.float()
    log_ratio = (new_lp - (old_lp if prox_lp is None else prox_lp)) * mask
    ratio = torch.exp(log_ratio)
    a = adv.float().unsqueeze(1)
    unclipped = ratio * a
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * a
    pg = -torch.minimum(unclipped, clipped)
    if dual_clip > 0:
        pg = torch.where(a < 0, torch.minimum(pg, -dual_clip * a), pg)
    if token_weight is not None:
        pg = pg * token_weight
    k3 = kl_estimate(new_lp, old_lp, mask, log_ratio if prox_lp is None else None, ref_lp)
    w = loss_weights(mask, agg, num_units)
    pg_loss = (pg * w).sum()
    loss = pg_loss + kl_coef * (k3 * w).sum()
    return loss, _loss_stats(pg_loss, k3, ratio, a, mask, clip_low, clip_high)


def kl_estimate(new_lp, old_lp, mask, log_ratio=None, ref_lp=None) -> torch.Tensor:
    """Per-token k3 [B,T]: to the reference policy where ``ref_lp`` is given (exp(ref - new) - 1
    - (ref - new), KL(current || reference)), else to the behaviour policy (ratio - 1 -
    log ratio); ``log_ratio``: new - old already masked, where the caller has it."""
    if ref_lp is not None:
        log_ref_ratio = (ref_lp - new_lp) * mask
        return torch.exp(log_ref_ratio) - 1.0 - log_ref_ratio
    log_behaviour_ratio = log_ratio if log_ratio is not None else (new_lp - old_lp) * mask
    return torch.exp(log_behaviour_ratio) - 1.0 - log_behaviour_ratio


@torch.no_grad()
def _loss_stats(pg_loss, k3, ratio, a, mask, clip_low: float, clip_high: float) -> LossStats:
    """The step's token means over the masked tokens (see ppo_clip_loss)."""
    n = mask.sum()
    denom = n.clamp(min=1.0)
    was_clipped = ((ratio < 1.0 - clip_low) & (a < 0)) | ((ratio > 1.0 + clip_high) & (a > 0))
    return LossStats(
        pg_loss=pg_loss.item(),
        kl=((k3 * mask).sum() / denom).item(),
        clip_frac=((was_clipped.float() * mask).sum() / denom).item(),
        ratio_mean=((ratio * mask).sum() / denom).item(),
        ratio_max=ratio.masked_fill(mask == 0, float("-inf")).max().item() if n > 0 else 1.0,
        tokens=n.item(),
    )
