"""Settings of the "funcs" family (``env.args`` when ``env.name = "funcs"``)."""

from typing import Literal

from pydantic import Field, model_validator

from tidal.config_section import Section


class FuncsConfig(Section):
    min_level: int = Field(1, ge=1)
    """Easiest difficulty level sampled for training tasks (operations composed in f)."""
    max_level: int = Field(3, ge=1)
    """Hardest difficulty level sampled for training (and held-out) tasks."""
    heldout_buckets: int = Field(10, ge=2)
    """1 in this many task specs (by a hash of the spec) is held out; never seen in training."""
    num_tests: int = Field(6, ge=1)
    """Hidden test cases per task."""
    num_examples: int = Field(1, ge=0)
    """Input/output examples shown in the prompt (beside the description)."""
    prompt_style: Literal["code", "instruct"] = "code"
    """How a task is asked: "code" = a completion prompt (``# Task:`` comments and ``def
    f(x):``; the model writes the body), for a model mid-trained on the family's corpus;
    "instruct" = in plain English as a chat message ("Write a Python function f(x) ... Reply
    with only the code."), for a pretrained instruct model, whose answer is graded from its
    first fenced code block (or its whole text when it has none)."""
    partial_credit: float = Field(0.0, ge=0.0, lt=1.0)
    """Reward of an answer that passes some hidden tests but not all: this times the fraction it
    passes (a task counts as solved only when all pass: reward 1). 0 = all or nothing. Why: a
    pretrained model that solves few tasks gives GRPO groups whose rewards are all 0, which
    teach nothing; partial credit ranks a half-right program above a broken one."""
    corpus_bug_rate: float = Field(0.3, ge=0.0, lt=1.0)
    """Mid-training corpus realism: the chance that each line of a corpus solution carries a
    typical slip (an off-by-one constant, a confused operator), as code found in the wild does.
    The pretrained model thus writes plausible but often wrong code, and RL learns correctness
    from the verifier. 0 = a perfectly clean corpus."""

    @model_validator(mode="after")
    def _check(self) -> "FuncsConfig":
        if self.min_level > self.max_level:
            raise ValueError(f"min_level ({self.min_level}) exceeds max_level ({self.max_level})")
        return self
