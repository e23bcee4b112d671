"""The deterministic guarantee checked where it runs: every trained step's engine-vs-trainer
mismatch, under engine.numerics = "deterministic", is acted on as engine.on_mismatch says.

The start-up probe (tidal.numerics.probe) chooses paths that held on sampled batches; a step's
mismatch metrics are the guarantee measured on the run's own tokens. A token that is not the
trainer's bit for bit there means the probe missed something on this machine, so the run says
so (and, if asked, stops) instead of only writing a number no one reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidal.orchestrator.records import GuardEvent

if TYPE_CHECKING:
    from tidal.engine.config import EngineConfig
    from tidal.orchestrator.records import RunState, StepRecord

DETECTOR = "numerics_mismatch"
"""GuardEvent.detector of a mismatch event."""


def promised(engine: EngineConfig) -> bool:
    """Whether this engine promises the trainer's bits: deterministic numerics on tidal's own
    forward (a vLLM or SGLang server computes its own logprobs)."""
    tidal_forward = engine.backend == "builtin" or engine.remote.kind == "tidal"
    return engine.numerics == "deterministic" and tidal_forward


def mismatch_evidence(record: StepRecord, engine: EngineConfig) -> dict | None:
    """The step's mismatch figures when it broke the promise; None when it kept it (or made none)."""
    if not promised(engine) or record.train is None:
        return None
    m = record.train.mismatch
    if not m.tokens or m.bitwise_equal_fraction >= 1.0:
        return None
    return {"bitwise_equal_fraction": m.bitwise_equal_fraction, "tokens": m.tokens,
            "max_abs_logprob_diff": m.max_abs_logprob_diff, "mean_abs_logprob_diff": m.mean_abs_logprob_diff}


def mismatch_event(record: StepRecord, engine: EngineConfig, state: RunState, version: int,
                   lr_scale: float, wall_s: float) -> GuardEvent | None:
    """Count a step that broke the promise in ``state``; the event to record at the first such
    step (at every one with engine.on_mismatch = "stop", which then ends RL), else None."""
    evidence = mismatch_evidence(record, engine)
    if evidence is None:
        return None
    state.mismatched_steps += 1
    action = "stop" if engine.on_mismatch == "stop" else "log"
    if state.mismatched_steps > 1 and action == "log":
        return None
    message = mismatch_message(state.step, evidence, action)
    return GuardEvent(state.step, DETECTOR, evidence, action, lr_scale, None, version, wall_s, message)


def mismatch_summary(state: RunState) -> dict:
    """summary.json's ``numerics`` additions: the count and the first event's message."""
    first = next((e.message for e in state.guard_events if e.detector == DETECTOR), None)
    return {"mismatched_steps": state.mismatched_steps, "mismatch": first}


def mismatch_message(step: int, evidence: dict, action: str) -> str:
    """What the user reads on stderr and in summary.json."""
    then = ("RL stops after this step (engine.on_mismatch = 'stop')" if action == "stop" else
            "RL goes on; later such steps are counted in summary.json (engine.on_mismatch = 'stop' ends RL instead)")
    return (f"step {step}: engine.numerics = 'deterministic' but {1 - evidence['bitwise_equal_fraction']:.2%} of "
            f"{evidence['tokens']} trained tokens have a sampling logprob other than the trainer's (largest "
            f"difference {evidence['max_abs_logprob_diff']:.3g}): the start-up probe's paths do not hold for "
            "this run's batches on this machine. `tidal doctor` shows the paths chosen; engine.numerics = "
            "'fast' with [trainer.off_policy] corrections is the honest setting here. " + then)
