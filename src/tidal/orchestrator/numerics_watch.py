"""The deterministic guarantee checked where it runs: every trained step's engine-vs-trainer
mismatch, under engine.numerics = "deterministic", is acted on as
orchestrator.guard.numerics_mismatch says (stop with an error by default).

The start-up probe (tidal.numerics.probe) chooses paths that held on sampled batches; a step's
mismatch metrics are the guarantee measured on the run's own tokens. A token that is not the
trainer's bit for bit there means the probe missed something on this machine, so the run says
so and stops (or corrects, or only logs, as configured) instead of only writing a number no one
reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidal.errors import UserError
from tidal.orchestrator.records import GuardEvent

if TYPE_CHECKING:
    from tidal.engine.config import EngineConfig
    from tidal.model.config import ModelConfig
    from tidal.orchestrator.config import GuardConfig
    from tidal.orchestrator.records import RunState, StepRecord

DETECTOR = "numerics_mismatch"
"""GuardEvent.detector of a mismatch event."""


def promised(engine: EngineConfig) -> bool:
    """Whether this engine promises the trainer's bits: deterministic numerics on tidal's own
    forward (a vLLM or SGLang server computes its own logprobs)."""
    tidal_forward = engine.backend == "builtin" or engine.remote.kind == "tidal"
    return engine.numerics == "deterministic" and tidal_forward


def opset_of(model: ModelConfig) -> str:
    """The deterministic paths the engine and the trainer run for ``model`` on this machine
    (chosen once per process by the probe; `tidal doctor` lists every candidate)."""
    import torch

    from tidal.numerics.probe import ProbeShapes, choose_paths

    return choose_paths(getattr(torch, model.dtype), ProbeShapes.of_model(model)).describe()


def mismatch_evidence(record: StepRecord, engine: EngineConfig) -> dict | None:
    """The step's mismatch figures when it broke the promise; None when it kept it (or made none)."""
    if not promised(engine) or record.train is None:
        return None
    m = record.train.mismatch
    if not m.tokens or m.bitwise_equal_fraction >= 1.0:
        return None
    return {"bitwise_equal_fraction": m.bitwise_equal_fraction, "tokens": m.tokens,
            "max_abs_logprob_diff": m.max_abs_logprob_diff, "mean_abs_logprob_diff": m.mean_abs_logprob_diff}


def act_on(record: StepRecord, engine: EngineConfig, model: ModelConfig, guard: GuardConfig,
           state: RunState, trainer, wall_s: float) -> GuardEvent | None:
    """Count a step that broke the promise in ``state``; the event to record at the first such
    step (at every one when guard.numerics_mismatch is "stop", which then ends RL), else None.
    A "correct" event has switched the trainer's correction on. The message names the
    deterministic paths the run chose (its ``numerics:`` line)."""
    evidence = mismatch_evidence(record, engine)
    if evidence is None:
        return None
    state.mismatched_steps += 1
    choice = guard.numerics_mismatch
    if state.mismatched_steps > 1 and choice != "stop":
        return None
    if choice == "correct":
        correct_from_now(trainer)
    paths = opset_of(model)
    return GuardEvent(state.step, DETECTOR, {**evidence, "opset": paths}, choice, getattr(trainer, "lr_scale", 1.0),
                      None, trainer.version, wall_s, mismatch_message(state.step, evidence, choice, paths))


def resumed(state: RunState, guard: GuardConfig, trainer) -> None:
    """A resumed run that had switched to the correction keeps it."""
    if state.mismatched_steps and guard.numerics_mismatch == "correct":
        correct_from_now(trainer)


def correct_from_now(trainer) -> None:
    """The "correct" choice: the trainer's loss weights each token by truncated importance
    sampling from its next step (as engine.numerics = "fast" needs), unless it corrects already."""
    from tidal.trainer.config import OffPolicyConfig

    if trainer.cfg.off_policy.kind == "none":
        trainer.use_off_policy(OffPolicyConfig(kind="truncated_is"))


def mismatch_summary(state: RunState) -> dict:
    """summary.json's ``numerics`` additions: the count and the first event's message."""
    first = next((e.message for e in state.guard_events if e.detector == DETECTOR), None)
    return {"mismatched_steps": state.mismatched_steps, "mismatch": first}


class NumericsMismatch(UserError):
    """RL stopped because the deterministic promise broke (orchestrator.guard.numerics_mismatch =
    "stop"); raised by `tidal train` once the run's checkpoint and summary are saved."""


WHAT_TO_DO = ("what to do: run `tidal doctor` on this machine and file its output with this message; "
              "to train here now, set engine.numerics = 'fast' with trainer.off_policy.kind = "
              "'truncated_is', or orchestrator.guard.numerics_mismatch = 'correct' (the same "
              "correction from the first such step)")


def mismatch_message(step: int, evidence: dict, choice: str, opset: str) -> str:
    """What the user reads on stderr and in summary.json."""
    then = {"stop": "RL stops after this step, saves and exits with an error "
                    "(orchestrator.guard.numerics_mismatch = 'stop'). " + WHAT_TO_DO,
            "correct": "RL goes on with trainer.off_policy.kind = 'truncated_is' from the next step "
                       "(orchestrator.guard.numerics_mismatch = 'correct'); later such steps are counted "
                       "in summary.json",
            "log": "RL goes on uncorrected (orchestrator.guard.numerics_mismatch = 'log'); later such "
                   "steps are counted in summary.json. " + WHAT_TO_DO}[choice]
    return (f"step {step}: engine.numerics = 'deterministic' but {1 - evidence['bitwise_equal_fraction']:.2%} of "
            f"{evidence['tokens']} trained tokens have a sampling logprob other than the trainer's (largest "
            f"difference {evidence['max_abs_logprob_diff']:.3g}): the start-up probe's paths ({opset}) do not "
            f"hold for this run's batches on this machine. {then}")
