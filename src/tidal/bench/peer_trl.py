"""The peer arm of ``tidal bench peer``: the same GRPO run through TRL's ``GRPOTrainer``.

    python -m tidal.bench.peer_trl --spec SPEC.json --out RESULT.json

SPEC.json is a ``PeerSpec`` (every field below); RESULT.json a ``PeerResult``. The benchmark
launches this module as a subprocess of its own, so the peak RSS it records
(``getrusage(RUSAGE_SELF).ru_maxrss``) is TRL's alone, not the benchmark's or tidal's arm's.

What is the same as tidal's arm: the checkpoint (loaded by transformers, fp32, on the CPU), the
training tasks (``sample_tasks(spec.funcs, train_tasks, train_seed, heldout=False)``, each asked
as one user message), the grader (``tidal.families.funcs.grade_many`` in a tidal sandbox, the
evaluator tidal's funcs environment grades with), the group size, prompts per optimizer step,
completion limit, temperature, learning rate, no reference model (``beta = 0``), one optimizer
step per generated batch (``num_iterations = 1``), torch threads, seed and wall budget.

One optimizer step = one generation of ``prompts_per_step * group`` completions:
``per_device_train_batch_size = prompts_per_step * group`` with ``gradient_accumulation_steps =
steps_per_generation = 1``, so GRPOConfig derives ``generation_batch_size`` = that same number.

The wall budget counts from the start of the first training step (model loading, the trainer's
set-up and the sandbox's start excluded); the run stops after the first step that ends past it,
so the last step overshoots by at most one step, and the rates use the measured time.
Everything else is TRL's default (loss "dapo", clip 0.2, rewards scaled by the group's std),
except ``gradient_checkpointing``, off as in tidal (TRL turns it on to save memory; at this size
it only costs recomputation). The GRPOConfig that ran is recorded in the result.

The final policy is saved with ``save_pretrained`` to ``save_to`` (with its tokenizer), so the
benchmark's single evaluator grades both arms the same way; nothing is evaluated here.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pydantic import Field, model_validator
from transformers import TrainerCallback

from tidal.bench.common import write_json
from tidal.families.funcs import FuncsConfig, Task, grade_many, reward_of, sample_tasks
from tidal.sandbox import Sandbox, SandboxConfig
from tidal.config_section import Section


def instruct_funcs() -> FuncsConfig:
    return FuncsConfig(min_level=1, max_level=2, prompt_style="instruct")


class PeerSpec(Section):
    """What one TRL run is given (SPEC.json); the benchmark fills it from its own run config."""

    checkpoint: str
    """A Hugging Face model folder (config.json, model.safetensors, tokenizer files with a chat
    template), loaded in fp32."""
    save_to: str
    """Folder the final policy (and its tokenizer) is saved to; replaced if it exists."""
    train_seed: int = 0
    """Seed of the training tasks (``sample_tasks(..., seed=train_seed, heldout=False)``)."""
    train_tasks: int = Field(256, ge=1)
    """Training tasks drawn; the trainer cycles through them (shuffled) while the budget lasts."""
    group: int = Field(8, ge=2)
    """Completions per prompt (TRL's ``num_generations``); GRPO needs at least 2."""
    prompts_per_step: int = Field(2, ge=1)
    """Distinct prompts per optimizer step; a step trains on ``prompts_per_step * group``."""
    max_completion_tokens: int = Field(64, ge=1)
    """Most tokens generated per completion (TRL's ``max_completion_length``)."""
    temperature: float = Field(0.7, gt=0)
    """Sampling temperature of the training rollouts."""
    learning_rate: float = Field(5e-6, gt=0)
    """AdamW learning rate (constant: ``lr_scheduler_type = "constant"``, no warm-up)."""
    wall_budget_s: float = Field(120.0, gt=0)
    """Seconds of training, from the first step's start; the step running when it ends finishes."""
    torch_threads: int = Field(0, ge=0)
    """``torch.set_num_threads`` (0 = torch's default)."""
    seed: int = 0
    """Trainer seed (sampling, shuffling)."""
    max_steps: int = Field(1_000_000, ge=1)
    """A cap on optimizer steps besides the budget (the budget is what normally ends a run)."""
    funcs: FuncsConfig = Field(default_factory=instruct_funcs)
    """The task family's settings (tidal's ``env.args``); ``prompt_style`` must be "instruct"."""
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    """The sandbox the grader runs in (tidal's ``env.sandbox``)."""

    @model_validator(mode="after")
    def _instruct_only(self) -> "PeerSpec":
        if self.funcs.prompt_style != "instruct":
            raise ValueError('funcs.prompt_style must be "instruct": TRL asks a chat model in '
                             "conversational form, and grades the answer's code block")
        return self


@dataclass
class PeerResult:
    """What one TRL run measured (RESULT.json)."""

    steps: int
    """Optimizer steps done."""
    completions: int
    """Completions generated and graded (counted by the reward function)."""
    completion_tokens: int
    """Tokens in those completions."""
    train_wall_s: float
    """From the first step's start to the last step's end."""
    completions_per_min: float
    peak_rss_mb: float
    """Peak resident memory of this whole process (``ru_maxrss``), model loading included."""
    load_s: float
    """Model, tokenizer and trainer set-up, outside the budget."""
    saved_to: str
    mean_reward_per_step: list[float] = field(default_factory=list)
    """TRL's logged mean reward of each step's batch."""
    grpo_config: dict = field(default_factory=dict)
    """The GRPOConfig fields that shape the run, as they ran."""


class WallBudget(TrainerCallback):
    """Stops training after the first step that ends more than ``budget_s`` after the first step
    began (the generation of a step is inside it), and records when the steps ran."""

    def __init__(self, budget_s: float):
        self.budget_s = budget_s
        self.start: float | None = None
        self.last_end: float | None = None

    def on_step_begin(self, args, state, control, **kwargs):
        if self.start is None:
            self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.last_end = time.perf_counter()
        if self.last_end - self.start > self.budget_s:
            control.should_training_stop = True

    @property
    def wall_s(self) -> float:
        return 0.0 if self.start is None else self.last_end - self.start


class FuncsReward:
    """TRL reward function: each completion's assistant text graded by tidal's funcs grader.

    Counts what it graded, so the result's completion count is measured, not derived."""

    __name__ = "funcs_pass"

    def __init__(self, sandbox: Sandbox, tasks: list[Task], partial_credit: float = 0.0):
        self.sandbox, self.partial_credit = sandbox, partial_credit
        self.by_id = {t.task_id: t for t in tasks}
        self.completions = 0
        self.tokens = 0

    def __call__(self, completions, task_id, completion_ids, **kwargs) -> list[float]:
        texts = [c[-1]["content"] for c in completions]  # each [{"role": "assistant", ...}]
        grades = grade_many(self.sandbox, [self.by_id[i] for i in task_id], texts, style="instruct")
        self.completions += len(texts)
        self.tokens += sum(len(ids) for ids in completion_ids)
        return [reward_of(g, self.partial_credit) for g in grades]


def train_dataset(tasks: list[Task]):
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": t.instruction}],
                               "task_id": t.task_id} for t in tasks])


def grpo_config(spec: PeerSpec, output_dir: str):
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=spec.prompts_per_step * spec.group,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=spec.group,
        max_completion_length=spec.max_completion_tokens,
        temperature=spec.temperature,
        learning_rate=spec.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        beta=0.0,
        num_iterations=1,
        gradient_checkpointing=False,
        max_steps=spec.max_steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        fp16=False,
        seed=spec.seed,
        disable_tqdm=True,
    )


RECORDED = ("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
            "generation_batch_size", "num_generations", "max_completion_length", "temperature",
            "top_p", "top_k", "learning_rate", "lr_scheduler_type", "beta", "num_iterations",
            "epsilon", "epsilon_high", "loss_type", "scale_rewards", "gradient_checkpointing",
            "weight_decay", "max_grad_norm", "seed")


def run(spec: PeerSpec) -> PeerResult:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    t0 = time.perf_counter()
    if spec.torch_threads:
        torch.set_num_threads(spec.torch_threads)
    model = AutoModelForCausalLM.from_pretrained(spec.checkpoint, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(spec.checkpoint)
    tasks = sample_tasks(spec.funcs, spec.train_tasks, spec.train_seed, heldout=False)
    budget = WallBudget(spec.wall_budget_s)
    with Sandbox(spec.sandbox) as sandbox, tempfile.TemporaryDirectory() as scratch:
        reward = FuncsReward(sandbox, tasks, spec.funcs.partial_credit)
        args = grpo_config(spec, scratch)
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args,
                              train_dataset=train_dataset(tasks), processing_class=tokenizer,
                              callbacks=[budget])
        load_s = time.perf_counter() - t0
        trainer.train()
    save_policy(trainer.model, tokenizer, Path(spec.save_to))
    rewards = [e["reward"] for e in trainer.state.log_history if "reward" in e]
    return PeerResult(
        steps=trainer.state.global_step, completions=reward.completions,
        completion_tokens=reward.tokens, train_wall_s=budget.wall_s,
        completions_per_min=60 * reward.completions / budget.wall_s if budget.wall_s else 0.0,
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB on Linux
        load_s=load_s, saved_to=spec.save_to, mean_reward_per_step=rewards,
        grpo_config={k: getattr(args, k) for k in RECORDED})


def save_policy(model, tokenizer, folder: Path) -> None:
    """``save_pretrained`` into a temp folder beside ``folder``, then renamed over it."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tidal.bench.peer_trl", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", required=True, help="SPEC.json: a PeerSpec")
    p.add_argument("--out", required=True, help="RESULT.json to write (a PeerResult)")
    a = p.parse_args(argv)
    spec = PeerSpec.model_validate(json.loads(Path(a.spec).read_text()))
    write_json(a.out, asdict(run(spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
