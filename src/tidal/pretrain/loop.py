"""Mid-training loop: next-token prediction on packed code documents.

    docs ──pack──> rows [N, seq_len] ──shuffled epochs──> batch [B, seq_len]
         ──forward/backward (cross-entropy)──> clip grad norm ──> AdamW at scheduled LR
         ──> every log_every steps: a line in pretrain_metrics.jsonl ──> at the end: save_pretrained

Stops at ``max_steps`` or ``time_budget_s``, whichever comes first. The learning rate warms up
linearly over ``warmup_steps`` then follows a cosine from ``lr`` down to 10% of it; the cosine's
progress is the larger of the step fraction and the elapsed-time fraction, so a run cut short by
its time budget still anneals and ends at the low learning rate instead of stopping mid-peak.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

from tidal.model import build_model, from_pretrained, load_tokenizer, save_pretrained
from tidal.pretrain.config import PretrainConfig
from tidal.pretrain.corpus import load_corpus, pack
from tidal.telemetry.progress import progress_bar

METRICS_FILE = "pretrain_metrics.jsonl"
MODEL_DIR = "model"
FINAL_LR_FRACTION = 0.1


def pretrain(cfg, out_dir: str | Path, docs: list[str] | None = None, progress: bool = True) -> Path:
    """Mid-train the model of ``cfg`` (a TidalConfig); returns the saved model folder,
    ``out_dir/model`` (a Hugging Face folder with the tokenizer, written atomically)."""
    with torch_threads(cfg.pretrain.num_threads):
        return _pretrain(cfg, Path(out_dir), docs, progress)


def _pretrain(cfg, out_dir: Path, docs: list[str] | None, progress: bool) -> Path:
    pc: PretrainConfig = cfg.pretrain
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(cfg.model.init_from)
    rows = pack(docs if docs is not None else corpus_documents(cfg), tokenizer, pc.seq_len)
    model = initial_model(cfg)
    optimizer = make_optimizer(model, pc)
    batches = shuffled_batches(rows, pc.batch_size, cfg.orchestrator.seed)
    tokens_per_step = min(pc.batch_size, len(rows)) * (pc.seq_len - 1)
    log = MetricsLog(out_dir / METRICS_FILE)
    bar = progress_bar(pc.max_steps, "pretrain", progress)
    start = time.perf_counter()
    step, elapsed = 0, 0.0
    while step < pc.max_steps and elapsed < pc.time_budget_s:
        lr = lr_at(pc, step, elapsed)
        loss = train_step(model, optimizer, next(batches), lr, pc.grad_clip, pc.dtype)
        step += 1
        elapsed = time.perf_counter() - start
        tok_s = step * tokens_per_step / elapsed
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tok_s:,.0f}", refresh=False)
        done = step >= pc.max_steps or elapsed >= pc.time_budget_s
        if step % pc.log_every == 0 or done:
            log.write(step=step, loss=loss, lr=lr, tokens_per_s=tok_s, elapsed_s=elapsed)
    bar.close()
    model.to(getattr(torch, cfg.model.dtype))
    save_pretrained(model, out_dir / MODEL_DIR, tokenizer=tokenizer)
    return out_dir / MODEL_DIR


# ---------------------------------------------------------------- steps


@contextlib.contextmanager
def torch_threads(n: int):
    """Run the block with n torch threads (0 = leave as is), restoring the previous count."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def corpus_documents(cfg) -> list[str]:
    """pretrain.corpus files if set, else the task family's built-in generator (training split)."""
    if cfg.pretrain.corpus:
        return load_corpus(cfg.pretrain.corpus)
    from tidal.tasks import build_corpus  # lazy: the task family pulls in the sandbox

    return build_corpus(cfg.env, cfg.pretrain.corpus_docs, cfg.orchestrator.seed)


def initial_model(cfg) -> torch.nn.Module:
    """model.init_from's checkpoint, or a fresh model seeded by orchestrator.seed; trained in fp32
    whatever model.dtype says (the dtype is applied when saving)."""
    if cfg.model.init_from:
        return from_pretrained(cfg.model.init_from, dtype="float32")
    return build_model(cfg.model.model_copy(update={"dtype": "float32"}), seed=cfg.orchestrator.seed)


def make_optimizer(model: torch.nn.Module, pc: PretrainConfig) -> torch.optim.AdamW:
    """AdamW(0.9, 0.95); weight decay on matrices only (norm gains would be pulled to 0)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": pc.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=pc.lr, betas=(0.9, 0.95))


def lr_at(pc: PretrainConfig, step: int, elapsed_s: float) -> float:
    """Linear warm-up, then cosine from lr to FINAL_LR_FRACTION * lr over the run's progress =
    max(step fraction after warm-up, elapsed-time fraction)."""
    if step < pc.warmup_steps:
        return pc.lr * (step + 1) / pc.warmup_steps
    step_frac = (step - pc.warmup_steps) / max(pc.max_steps - pc.warmup_steps, 1)
    progress = min(1.0, max(step_frac, elapsed_s / pc.time_budget_s))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return pc.lr * (FINAL_LR_FRACTION + (1.0 - FINAL_LR_FRACTION) * cosine)


def shuffled_batches(rows: torch.Tensor, batch_size: int, seed: int) -> Iterator[torch.Tensor]:
    """Endless [B, seq_len] batches: each epoch a fresh permutation, the last partial batch of an
    epoch dropped (B = all rows when there are fewer than batch_size)."""
    g = torch.Generator().manual_seed(seed)
    b = min(batch_size, len(rows))
    while True:
        perm = torch.randperm(len(rows), generator=g)
        for i in range(0, len(perm) - b + 1, b):
            yield rows[perm[i : i + b]]


def train_step(model, optimizer, batch: torch.Tensor, lr: float, grad_clip: float, dtype: str) -> float:
    """One next-token-prediction step on batch [B, seq_len]; returns the mean loss (nats/token).
    dtype "bfloat16" runs the forward under autocast (the logits come back fp32)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    device = batch.device.type
    with torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
        logits = model(batch[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss.item()


class MetricsLog:
    """Appends one JSON object per line, flushed each time (a crash loses at most one line)."""

    def __init__(self, path: Path):
        self.path = path

    def write(self, **fields) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(fields) + "\n")
