"""The ``[online]`` section: real-time RL on served traffic (``tidal serve``).

    serve ── responses (prompt, tokens, logprobs, experts, version) ──> store
    users ── POST /v1/feedback ──> store (durable before the ack)
    learner ── feedback joined to its response ──reward──> Trainer.step ──> candidate version
    gate (held-out pass@1 + behaviour guards) ──> canary (a share of traffic, sequential test)
        ──> promoted, or rolled back bit-exact to the incumbent

Every default lives here; each field is documented (tests/test_config.py checks).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tidal.config_section import Section


class ServeConfig(Section):
    host: str = "127.0.0.1"
    """Address the HTTP API listens on."""
    port: int = Field(8000, ge=0, le=65535)
    """Port of the HTTP API (0 = any free port, printed at start)."""
    model_name: str = "tidal"
    """The model id /v1/models lists and requests name (an unknown name is a 404)."""
    max_body_bytes: int = Field(1_000_000, ge=1024)
    """Largest request body accepted; a larger one is a 413 and is not read further."""
    max_feedback_bytes: int = Field(16_384, ge=256)
    """Largest /v1/feedback body accepted (a 413 beyond it); feedback is small."""
    max_tokens: int = Field(256, ge=1)
    """max_tokens when a request gives none (and the largest one accepted)."""
    max_n: int = Field(8, ge=1)
    """Largest ``n`` (completions per request) accepted."""
    poll_s: float = Field(1.0, gt=0)
    """How often the server reads the version registry for promotions, canaries, rollbacks."""
    require_keys: bool = True
    """Every request must present an API key (``Authorization: Bearer``): anyone who reaches
    the port could otherwise give feedback and steer the learner. False (``tidal serve
    --no-auth``) is accepted on a loopback host only (tidal.online.api.auth)."""
    keys_file: str = ""
    """JSON file of API keys with their roles (docs/online.md, "Keys"; mode 600), besides the
    TIDAL_API_KEYS / TIDAL_ADMIN_KEYS environment variables; "" = those alone."""


class StoreConfig(Section):
    database_url: str = ""
    """SQLAlchemy URL of the feedback and version store; "" = SQLite ``RUN_DIR/online.db`` in WAL
    mode. PostgreSQL: ``postgresql+psycopg://user@host/db``."""
    commit_window_ms: float = Field(2.0, ge=0)
    """Group commit: writes arriving within this window share one durable transaction (each is
    acknowledged only after it commits)."""
    max_batch: int = Field(512, ge=1)
    """Most writes one transaction holds."""


class RewardConfig(Section):
    """Feedback -> reward. Behaviour penalties replace the user's signal: a broken tool call, an
    empty answer or a question instead of an action is never a free escape."""

    version: str = "reward-v1"
    """Name recorded with every reward it makes; change it whenever a value below changes."""
    accepted: float = 0.75
    """A suggestion the user kept as it was."""
    edited: float = 0.25
    """A suggestion the user edited, then kept."""
    rejected: float = -0.25
    """A suggestion the user rejected."""
    dissatisfied: float = -0.5
    """A follow-up that says the answer did not help."""
    scalar_scale: float = 1.0
    """A scalar signal (in [-1, 1]) becomes ``scalar_scale * value``."""
    invalid_tool_call: float = -1.0
    """Reward of a response whose tool call does not parse, whatever the user said."""
    empty: float = -0.5
    """Reward of an empty response (shows the user nothing), whatever the user said."""
    question: float = -0.5
    """Reward of a question where an action was asked for, whatever the user said."""
    behaviour_overrides_signal: bool = True
    """Apply the three behaviour rewards above in place of the user's signal (False: add them)."""


class LearnerConfig(Section):
    enabled: bool = True
    """Run the online learner (a child process of ``tidal serve``)."""
    events_per_step: int = Field(64, ge=2)
    """Feedback events per optimizer step (their rewards' mean is the baseline)."""
    steps_per_candidate: int = Field(4, ge=1)
    """Optimizer steps before a candidate version is made."""
    candidate_every_s: float = Field(0.0, ge=0)
    """Also make a candidate this often (seconds) once it trained at least one step; 0 = only
    after ``steps_per_candidate``."""
    baseline: Literal["prompt", "batch"] = "prompt"
    """What a reward is compared with: "prompt" = the running mean reward of earlier responses
    to the same prompt (users ask the same things again; the step's mean for a prompt not seen
    before), "batch" = the step's mean reward (plain REINFORCE). Either way the step then
    centres and scales the differences as GRPO does."""
    baseline_window: int = Field(32, ge=1)
    """The per-prompt running mean weighs the last ~this many rewards of a prompt (an
    exponential mean once a prompt has this many), so it follows a policy that improves."""
    max_backlog: int = Field(2048, ge=1)
    """Feedback events not yet learned from beyond which /v1/feedback answers 429 + Retry-After."""
    max_staleness: int = Field(16, ge=0)
    """Drop (and count) events whose response came from a version more than this many learner
    steps behind; the recorded logprobs correct the rest (trainer.off_policy)."""
    lr: float = Field(4e-4, gt=0)
    """Learning rate of the online learner, in place of trainer.lr (`tidal train`'s; the rest of
    the trainer section applies, and `tidal serve` says so when it starts): 4e-4
    raised the default funcs model's pass rate where 1e-3 lowered it (docs/online.md,
    "Learning")."""
    threads: int = Field(1, ge=1)
    """torch threads of the learner process (the server keeps the rest)."""
    nice: int = Field(10, ge=0, le=19)
    """How much lower the learner's CPU priority is than the server's (os.nice): serving and
    the feedback acks are latency-bound, training is throughput-bound (docs/online.md,
    "Learning")."""


class GateConfig(Section):
    enabled: bool = True
    """Gate every candidate before it gets traffic (False: straight to canary)."""
    alpha: float = Field(0.05, gt=0, lt=1)
    """Significance level of every gate test (one-sided)."""
    heldout_tasks: int = Field(128, ge=8)
    """Held-out tasks of the simulated RL the candidate and the incumbent are scored on."""
    guard_prompts: int = Field(64, ge=8)
    """Prompts (recent served ones, else held-out tasks) the behaviour guards are measured on."""
    latency_tolerance: float = Field(1.5, gt=1)
    """Block a candidate whose median latency per guard response (in decode steps: tidal.online.gate)
    exceeds the incumbent's by this factor."""


class CanaryConfig(Section):
    share: float = Field(0.25, gt=0, lt=1)
    """Fraction of requests the canary serves."""
    alpha: float = Field(0.05, gt=0, lt=1)
    """Error bound of the sequential test (always valid: checked after every event)."""
    tau: float = Field(0.1, gt=0)
    """Std of the mSPRT's normal mixture over the difference in rates (the effect size it is
    most sensitive to)."""
    min_test_events: int = Field(20, ge=1)
    """Events on each side before the sequential test may decide anything: its plug-in
    variance is meaningless on a handful (a canary whose first few events were all accepts
    read as "significantly better" than the incumbent's 0.71)."""
    min_events: int = Field(48, ge=1)
    """Canary feedback events before it may be promoted (rollback may come earlier)."""
    max_events: int = Field(400, ge=1)
    """Canary feedback events after which it is decided on its point estimates."""


class OnlineConfig(Section):
    serve: ServeConfig = Field(default_factory=ServeConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    gate: GateConfig = Field(default_factory=GateConfig)
    canary: CanaryConfig = Field(default_factory=CanaryConfig)

    @model_validator(mode="after")
    def _check(self) -> "OnlineConfig":
        if self.canary.max_events < self.canary.min_events:
            raise ValueError(f"online.canary.max_events ({self.canary.max_events}) is below "
                             f"online.canary.min_events ({self.canary.min_events})")
        return self
