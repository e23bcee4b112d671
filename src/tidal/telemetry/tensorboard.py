"""TensorBoard scalars of a run in RUN_DIR/tensorboard/, mirroring the step and eval records of metrics.jsonl.

metrics.jsonl stays the record of truth; this is a live view of it (``tensorboard --logdir RUN_DIR``).
Every numeric field of a step record becomes a scalar under its own name (``train/loss`` stays
``train/loss``); eval fields go under ``eval/`` so an eval's ``wall_s`` never lands on the same
curve as a step's. A guard event (``kind = "guard"``) becomes ``guard/lr_scale`` and
``guard/<detector>`` = 1 (its action: ``guard/restore``, ``guard/stop`` or ``guard/log`` = 1).
The x value is ``record["step"]``. Other fields (dicts such as
``staleness_hist``, strings, nulls) and other kinds of record (worker spans) are not scalars and
are skipped.
"""

from __future__ import annotations

from pathlib import Path

# Fields that index a record rather than measure something.
_NOT_SCALARS = {"kind", "step", "label"}


def scalars_of(record: dict) -> dict[str, float]:
    """The TensorBoard tags and values of one metrics record (empty for kinds other than
    step, eval and guard)."""
    kind = record.get("kind")
    if kind == "guard":
        return {"guard/lr_scale": float(record["lr_scale"]), f"guard/{record['detector']}": 1.0,
                f"guard/{record['action']}": 1.0}
    if kind not in ("step", "eval"):
        return {}
    prefix = "eval/" if kind == "eval" else ""
    return {prefix + k: float(v) for k, v in record.items()
            if k not in _NOT_SCALARS and isinstance(v, (int, float)) and not isinstance(v, bool)}


class TensorBoardLog:
    """Writes the scalars of each step/eval record with ``torch.utils.tensorboard.SummaryWriter``."""

    def __init__(self, run_dir: str | Path):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(run_dir) / "tensorboard"
        self._writer = SummaryWriter(log_dir=str(self.log_dir))

    def write(self, record: dict) -> None:
        for tag, value in scalars_of(record).items():
            self._writer.add_scalar(tag, value, global_step=int(record["step"]))

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> TensorBoardLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
