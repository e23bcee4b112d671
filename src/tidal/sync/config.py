"""Weight sync: how versions are encoded, served, relayed and pulled (the ``[sync]`` section)."""

from typing import Annotated, Literal

from pydantic import Field, field_validator

from tidal.config_section import AUTO_DTYPE, Section
from tidal.sync.tensors import DtypeRule, check_dtype_name


class SyncConfig(Section):
    transport: Literal["http", "filesystem"] = "http"
    """How `tidal train` moves weights to its rollout workers: "http" = the delta publisher, an
    origin server on loopback and one puller per worker (this subsystem); "filesystem" = whole
    Hugging Face folders in the run directory (simple to inspect and debug)."""
    serving_dtype: Annotated[str, AUTO_DTYPE] = "auto"
    """dtype `tidal sync publish` casts floating-point tensors to before publishing (any floating
    torch dtype name: bfloat16, float16, float32, float8_e4m3fn, ...), or "keep" = every tensor
    in the dtype it is stored in, bit for bit (mixed fp8/bf16/fp32 checkpoints). "auto" = what
    model.dtype's "auto" is on the publishing machine (bfloat16 with native bf16, else float32);
    set it explicitly when the pools that pull run on other hardware. `tidal train` publishes in
    model.dtype, the dtype its engines run. dtype_rules override it per tensor."""
    dtype_rules: list[DtypeRule] = Field(default_factory=list)
    """Per-tensor dtypes, tried in order before serving_dtype, the first matching rule deciding:
    a list of {pattern = GLOB over tensor names, dtype = "keep" or a floating torch dtype,
    lossy = false}, e.g. [{pattern = "*.weight_scale*", dtype = "keep"}, {pattern = "*norm*",
    dtype = "float32"}]. Used by `tidal sync publish` and by `tidal train`'s publisher. An fp8
    tensor cast to a dtype that cannot hold its values is an error unless its rule says
    lossy = true. [] = serving_dtype for every floating tensor."""
    anchor_every: int = Field(10, ge=1)
    """Publish a full snapshot (an anchor) every this many versions; the others are deltas
    against the previous version. 1 = anchors only."""
    chunk_elements: int = Field(1 << 22, ge=1024, le=1 << 30)
    """Largest chunk, in tensor elements: the unit of parallel encode/decode, of the per-chunk
    checksum and of resuming a transfer."""
    keep_versions: int = Field(32, ge=2)
    """Versions an origin keeps on disk (older ones are deleted; the newest anchor is always kept)."""
    relay_cache_versions: int = Field(8, ge=1)
    """Versions a relay keeps in its cache (K)."""
    connections: int = Field(4, ge=1, le=64)
    """Parallel HTTP connections a puller (or relay) uses for one version's data."""
    request_bytes: int = Field(4 << 20, ge=4096)
    """Target bytes per HTTP range request; adjacent chunks are fetched together up to this size."""
    inline_bytes: int = Field(64 << 20, ge=0)
    """A form whose data is at most this many bytes travels inside the puller's one /pull answer
    (deltas); bigger ones (anchors) are fetched by parallel range requests afterwards."""
    retries: int = Field(4, ge=0, le=100)
    """Times a puller retries a failed request (per range, on each upstream) before it moves to
    the next upstream or gives up."""
    timeout_s: float = Field(30.0, gt=0)
    """Seconds without progress before an HTTP request counts as failed."""
    poll_interval_s: float = Field(0.05, ge=0)
    """Seconds a rollout worker waits between two asks for the newest version (it asks between
    decode steps; 0 = every time)."""
    hash: Literal["blake3", "sha256"] = "blake3"
    """Hash of each tensor's final bytes that the publisher writes into a version's manifest and
    every puller checks before it uses the version. "blake3" (cryptographic, ~3x faster per core
    than sha256 here, multi-threaded across tensors) or "sha256". Pullers verify whichever a
    manifest names, and old manifests (sha256, no hash field) too; a puller of a tidal version
    that predates this field cannot read new manifests (nor PAIRED chunks) whichever is chosen."""
    threads: int = Field(2, ge=1, le=256)
    """Threads that encode or decode chunks in parallel."""

    @field_validator("serving_dtype")
    @classmethod
    def _known_serving_dtype(cls, v: str) -> str:
        return check_dtype_name(v, ("auto", "keep"))
