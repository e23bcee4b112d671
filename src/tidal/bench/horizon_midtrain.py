"""The horizon benchmark's mid-training: the expert's demonstrations, drilled, then at each window.

    drill: demonstrations at bench.drill_window, drill_files per task, for bench.drill_steps
        ──> compared windows: demonstrations at each window, for pretrain.max_steps
        ──> pretrain.cache_dir/horizon-<key>/model (the model both modes' RL starts from)

Both stages are tidal's own mid-training (``tidal.pretrain.loop.pretrain``) on demonstration
rows (``demos.demo_rows``: one row per segment, loss on the expert's turns and summaries only)
with the run config's ``[pretrain]`` and ``[model]`` sections; only the sequence length (the
stage's window) and, for the drill, the budget (bench.drill_steps, bench.drill_s) are the
stage's. The result is cached under a key of everything that made it, and a second invocation
with the same settings reuses it.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import tidal
from tidal.bench.config import run_seed, with_keys
from tidal.config import TidalConfig
from tidal.families.ledger.config import LedgerConfig
from tidal.families.ledger.sizing import LedgerWindow
from tidal.harness import HarnessConfig

MIDTRAIN_FACTS = "midtrain.json"
RunHarness = Callable[[HarnessConfig], HarnessConfig]
"""The family's harness settings at a window -> the run's (the harness keys the user gave on top)."""
DRILL_SEED_OFFSET = 100
"""The drill's demonstrations are drawn with seed + this (the compared windows' with the seed)."""


def midtrain_key(bench, cfg: TidalConfig, windows: list[LedgerWindow], harness: RunHarness) -> str:
    """Hashes what makes the mid-trained model: the demonstrations' settings (the benchmark's,
    the windows' ledger configs and harnesses, the seed) and the model and pretrain sections,
    all of them but where the cache lives and how often it logs (as tidal.pretrain.cache does)."""
    from tidal.families.ledger import tasks as family
    from tidal.pretrain.cache import NOT_HASHED

    what = {"bench": bench.model_dump(mode="json", include={"windows", "horizon", "demo_episodes",
                                                            "drill_window", "drill_files", "drill_steps",
                                                            "drill_s"}),
            "seed": run_seed(cfg),
            "model": cfg.model.model_dump(mode="json"),
            "pretrain": cfg.pretrain.model_dump(mode="json", exclude=NOT_HASHED["pretrain"]),
            "ledger": [w.ledger.model_dump(exclude={"corpus_window"}) for w in windows],
            "harness": [harness(w.harness("summarize")).model_dump() for w in windows],
            "generator": family.GENERATOR_VERSION, "tidal": tidal.__version__}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:12]


def midtrain(bench, cfg: TidalConfig, windows: list[LedgerWindow], harness: RunHarness,
             progress: bool) -> tuple[Path, dict]:
    """The mid-trained model folder and facts about its corpus and training (``key``, ``model``;
    ``reused``: True when it came from the cache). ``harness``: the family's harness settings
    -> the run's (the demonstrations play through them, in summarize mode)."""
    from tidal.fsutil import replace_dir
    from tidal.model.checkpoint import COMPLETE_MARKER
    from tidal.pretrain.loop import MODEL_DIR

    key = midtrain_key(bench, cfg, windows, harness)
    root = Path(cfg.pretrain.cache_dir) / f"horizon-{key}"
    where = {"key": key, "model": str(root / MODEL_DIR)}
    if (root / MODEL_DIR / COMPLETE_MARKER).is_file():
        return root / MODEL_DIR, {**json.loads((root / MIDTRAIN_FACTS).read_text()), **where, "reused": True}
    staging = root.parent / f".{root.name}.tmp-{uuid.uuid4().hex[:8]}"
    facts: dict = {}
    seq_len = max(w.window for w in windows)
    stage_cfg = with_keys(cfg, {"pretrain.seq_len": seq_len})
    if bench.drill_steps > 0 and bench.drill_s > 0:
        facts["drill"] = drill(bench, cfg, staging / "drill", windows[0].ledger, harness, progress)
        stage_cfg = with_keys(stage_cfg, {"model.init_from": str(staging / "drill" / MODEL_DIR)})
    per_window = max(1, bench.demo_episodes // len(windows))
    stages = [(w.ledger, w.window, harness(w.harness("summarize"))) for w in windows]
    facts.update(midtrain_stage(stage_cfg, staging, stages, per_window, run_seed(cfg), progress))
    (staging / MIDTRAIN_FACTS).write_text(json.dumps(facts))
    root.parent.mkdir(parents=True, exist_ok=True)
    replace_dir(staging, root)
    return root / MODEL_DIR, {**facts, **where, "reused": False}


def drill(bench, cfg: TidalConfig, out: Path, like: LedgerConfig, harness: RunHarness,
          progress: bool) -> dict:
    """The drill stage: short tasks (``drill_files`` files, the other settings ``like``'s) at the
    small ``drill_window``, so a summary to copy comes every ~200 tokens."""
    from tidal.families.ledger.demos import harness_for

    ledger = LedgerConfig.model_validate({**like.model_dump(), "num_files": bench.drill_files,
                                          "corpus_window": bench.drill_window})
    drill_harness = harness(harness_for(bench.drill_window, "summarize", max_ops=ledger.max_ops))
    drill_cfg = with_keys(cfg, {"pretrain.seq_len": bench.drill_window,
                                "pretrain.max_steps": bench.drill_steps,
                                "pretrain.time_budget_s": bench.drill_s})
    episodes = max(1, bench.demo_episodes // 2)
    return midtrain_stage(drill_cfg, out, [(ledger, bench.drill_window, drill_harness)], episodes,
                          run_seed(cfg) + DRILL_SEED_OFFSET, progress)


def midtrain_stage(cfg: TidalConfig, out: Path, stages: list[tuple[LedgerConfig, int, HarnessConfig]],
                   episodes: int, seed: int, progress: bool) -> dict:
    """Next-token training on the expert's segments of ``episodes`` episodes per (ledger config,
    window, harness) in ``stages``; the model lands in ``out``. Returns the stage's facts."""
    from tidal.families.ledger.demos import demo_rows, demo_segments
    from tidal.model.tokenizer import ByteTokenizer
    from tidal.pretrain.loop import METRICS_FILE, pretrain

    t0 = time.perf_counter()
    segments = []
    for i, (ledger, window, harness) in enumerate(stages):
        segments += demo_segments(ledger, window, episodes, seed + i, harness)
    rows = demo_rows(segments, cfg.pretrain.seq_len, ByteTokenizer().pad_id)
    corpus_s = time.perf_counter() - t0
    pretrain(cfg, out, rows=rows, progress=progress)
    curve = [json.loads(line) for line in (out / METRICS_FILE).read_text().splitlines()]
    return {"segments": len(segments), "episodes": episodes * len(stages), "corpus_s": corpus_s,
            "steps": curve[-1]["step"], "final_loss": curve[-1]["loss"],
            "train_s": curve[-1]["elapsed_s"]}
