"""Inference engine: batching limits and the sampler."""

from typing import Literal

from pydantic import Field, model_validator

from tidal.config_section import Section


class RemoteConfig(Section):
    """Where a rollout worker generates when ``engine.backend = "remote"`` (docs/scale.md,
    "Remote inference")."""

    url: str = ""
    """Base URL of the OpenAI-compatible server, e.g. "http://10.0.0.5:8000" (no trailing /v1).
    Required with engine.backend = "remote"."""
    kind: Literal["tidal", "vllm", "sglang"] = "tidal"
    """What the server is, which decides how tokens, logprobs, versions and experts are read and
    how new weights are loaded: tidal (`tidal serve`: POST /v1/tidal/update_weights, reports
    version, manifest digest and MoE expert ids), vllm (`vllm serve` in dev mode: POST
    /collective_rpc reload_weights from the folder the pool's puller writes), sglang (POST
    /update_weights_from_disk; generation through its native /generate)."""
    model: str = ""
    """The model name sent with every request; "" = none (the server's only model)."""
    api_key_env: str = "TIDAL_API_KEY"
    """The environment variable (on the worker's machine) holding the key sent with every
    request as ``Authorization: Bearer``; unset or empty: none is sent. A tidal serve needs an
    admin key there (the weight reload is admin-only: docs/online.md, "Keys"); the key itself
    never goes into a config, which is written to run folders and sent to joining workers."""
    weights_dir: str = ""
    """vllm and sglang only: the folder the server loads weights from, into which this worker's
    sync puller writes each new version (config.json + model.safetensors) before it asks the
    server to reload. Must be a folder the server can read (its machine, or a shared mount)."""
    connect_timeout_s: float = Field(10.0, gt=0)
    """Seconds to open a connection to the server, per attempt."""
    request_timeout_s: float = Field(300.0, gt=0)
    """Seconds one generation request may take in all (the server sends nothing before it is
    done), per attempt. A server that dies mid-request fails the request after at most this."""
    update_timeout_s: float = Field(600.0, gt=0)
    """Seconds a weight reload call may take (the server pulls and loads the version)."""
    retries: int = Field(2, ge=0, le=20)
    """Extra attempts per request after a connection error, a timeout, a 5xx answer or a
    response from a version older than the staleness bound; then the worker fails (the
    orchestrator re-runs its assignment on a fresh worker)."""
    retry_backoff_s: float = Field(0.5, ge=0)
    """Seconds before the first retry, doubling with each further one."""
    max_in_flight: int = Field(64, ge=1)
    """Requests this worker has open at the server at once; more wait in the worker's queue."""
    launch: bool = False
    """kind vllm only: the rollout worker starts `vllm serve` itself on weights_dir at the port
    of url, health-checks it and starts it again if it dies (tidal.engine.vllm_server); one
    server per worker. False: the server is started by someone else."""
    launch_command: list[str] = ["vllm", "serve"]
    """The program (and its first arguments) that starts the server; tidal appends the model
    folder and its own flags (vllm_server.vllm_command), then launch_args."""
    launch_args: list[str] = []
    """More flags for the launched server, e.g. ["--gpu-memory-utilization", "0.5"]."""
    startup_timeout_s: float = Field(900.0, gt=0)
    """Seconds a launched server may take to answer GET /health (loading, compiling)."""
    max_restarts: int = Field(3, ge=0)
    """Times a launched server that died is started again before the worker fails."""
    poll_s: float = Field(0.02, gt=0, le=1.0)
    """Longest a ``step()`` waits for a finished request before it returns none (the harness
    then lets episodes advance and calls it again), seconds."""


class EngineConfig(Section):
    backend: Literal["builtin", "remote"] = "builtin"
    """builtin: rollout workers generate with tidal's own engine (this section's settings);
    remote: they send prompt token ids to the OpenAI-compatible server of [engine.remote]
    (tidal serve, vLLM or SGLang). Held-out evaluation always uses the builtin engine."""
    remote: RemoteConfig = Field(default_factory=RemoteConfig)
    """The server of engine.backend = "remote"."""
    max_batch_size: int = Field(128, ge=1)
    """Sequences decoded together (KV-cache slots). Requests beyond it wait in a queue."""
    max_seq_len: int = Field(256, ge=8)
    """Longest prompt + completion in tokens a slot can hold."""
    temperature: float = Field(1.0, ge=0.0)
    """Sampling temperature; 0 = greedy. Logprobs are of the distribution actually sampled."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass (1.0 = off)."""
    max_new_tokens: int = Field(96, ge=1)
    """Completion length cap per request, in tokens."""
    stop: list[str] = ["\n\n"]
    """Stop strings: generation ends once the decoded completion contains one (kept in output)."""
    seed: int = 0
    """Seed of the engine's generator, which seeds the requests that carry no seed of their own
    (GenerationRequest.seed). RL rollouts and held-out evaluation carry their own, derived from
    run.seed, so in `tidal train` this one plays no part."""
    max_prefill_tokens: int = Field(8192, ge=1)
    """Padded tokens (requests x longest prompt) per prefill forward; bounds the activation and
    logits memory of admitting many requests at once. A single longer prompt still runs alone."""
    numerics: Literal["deterministic", "fast"] = "deterministic"
    """deterministic: batch-invariant kernels (tidal.numerics), so every sampling logprob is bit
    for bit what the trainer recomputes for that token (the trainer runs the same forward);
    fast: the fused forward on fast ops (numerics/fast.py), faster per step but off by ~1e-6 from the trainer,
    and with it MoE routing that can flip."""
    prefix_cache: bool = True
    """Keep a finished request's KV cache in its (now free) slot, and when a new prompt starts
    with that request's tokens, prefill only the rest. A multi-turn episode sends its whole
    context again each turn (context + last turn + observation), so this turns its prefill from
    the whole context into the new observation. Prefixes match in whole blocks of 16 tokens.
    A parked cache in the way of an admission moves to an empty free slot, or is dropped if
    none is left; a weight update drops them all (their keys are of the old weights)."""
    share_prompts: bool = True
    """Requests admitted together with the same prompt (GRPO's group_size samples of a task)
    prefill it once: the first of them prefills it, the others copy its keys/values and prefill
    only the last prompt token (chunked prefill: in deterministic mode the same bits as their
    own full prefill). On the default recipe a prompt is ~120 tokens and 8 samples share it;
    prefill was about half of a rollout's generation time."""
    recompute_kv_on_reload: bool = True
    """On a weight update, recompute the KV cache of in-flight sequences with the new weights, so
    every token after the update is exactly what the new policy gives for its whole context (one
    prefill of the running batch per update). False keeps the stale cache: faster, slightly
    off-policy."""

    @model_validator(mode="after")
    def _check(self) -> "EngineConfig":
        if self.backend == "remote" and not self.remote.url:
            raise ValueError('engine.backend = "remote" needs engine.remote.url (the server\'s base '
                             'URL, e.g. "http://127.0.0.1:8000")')
        if self.backend == "remote" and self.remote.kind != "tidal" and not self.remote.weights_dir:
            raise ValueError(f"engine.remote.kind = {self.remote.kind!r} needs engine.remote."
                             "weights_dir: the folder the server reloads weights from")
        if self.max_new_tokens >= self.max_seq_len:
            raise ValueError(
                f"engine.max_new_tokens ({self.max_new_tokens}) must be below "
                f"engine.max_seq_len ({self.max_seq_len}) to leave room for the prompt"
            )
        return self
