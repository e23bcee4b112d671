"""Tensors as weight sync sees them: bit patterns, and the dtype each one is published in.

``TensorBits`` views every dtype as unsigned integers of its width, so the codec and the hashes
never do float arithmetic (NaN payloads, -0.0 and subnormals stay exact); safetensors folders are
read and written as such. ``serving_tensors`` decides which dtype each published tensor travels
in, for `tidal sync publish` and the trainer's publisher alike.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

import numpy as np
import torch
from pydantic import Field, field_validator

from tidal.config_section import Section
from tidal.sync.errors import SyncError


UINT_BY_WIDTH = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32, 8: torch.uint64}


@dataclass
class TensorBits:
    """One tensor: ``bits`` is a flat array of unsigned ints of the element's width."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    bits: np.ndarray
    file: str = "model.safetensors"

    def sha256(self) -> str:
        return self.digest("sha256")

    def digest(self, hash: str) -> str:
        """Hex digest of the tensor's bytes (little-endian, C order) by ``hash`` (a manifest's
        ``hash``: "blake3" or "sha256")."""
        hasher = new_hasher(hash)
        hasher.update(memoryview(np.ascontiguousarray(self.bits)).cast("B"))
        return hasher.hexdigest()

    def to_torch(self) -> torch.Tensor:
        return torch.from_numpy(self.bits).view(torch_dtype(self.dtype)).reshape(self.shape)


def new_hasher(hash: str):
    """An empty hasher for a manifest's ``hash`` (both have update() and hexdigest(); both
    release the GIL on large buffers). One thread per hasher: parallelism comes from hashing
    several tensors at once, which keeps each thread's bytes hot in its core's cache."""
    if hash == "blake3":
        import blake3

        return blake3.blake3()
    if hash == "sha256":
        return hashlib.sha256()
    raise ValueError(f"unknown tensor hash {hash!r} (this version of tidal knows blake3 and sha256)")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype a manifest or checkpoint names; a version naming one this torch lacks (an
    fp8 format newer than it) is an error saying so, not a crash deep in decoding."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise SyncError(f"unknown torch dtype {name!r}: this torch ({torch.__version__}) does not have it; "
                        f"install a torch that does, or publish that tensor in another dtype (sync.dtype_rules)")
    return dtype


def bits_of(name: str, tensor: torch.Tensor, file: str = "model.safetensors") -> TensorBits:
    """A copy of ``tensor``'s bytes as unsigned ints (its own memory: later training steps that
    change the tensor in place do not change what was published)."""
    t = tensor.detach().cpu().contiguous().reshape(-1)
    uint = UINT_BY_WIDTH[t.element_size()]
    bits = t.view(uint).numpy().copy()
    return TensorBits(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), bits, file)


def cast_floats(tensors: dict[str, torch.Tensor], dtype: str) -> dict[str, torch.Tensor]:
    """Floating-point tensors to the serving dtype; integer and bool tensors unchanged."""
    target = torch_dtype(dtype)
    return {k: v.to(target) if v.is_floating_point() else v for k, v in tensors.items()}


def read_safetensors_folder(folder: Path) -> list[TensorBits]:
    """Every tensor of every ``*.safetensors`` file in ``folder`` (sorted by file, then name)."""
    from safetensors import safe_open

    out = []
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for name in sorted(f.keys()):
                out.append(bits_of(name, f.get_tensor(name), path.name))
    return out


def write_safetensors_files(tensors: list[TensorBits], folder: Path) -> None:
    """One safetensors file per distinct ``file`` of the tensors (byte-identical tensors)."""
    from safetensors.torch import save_file

    by_file: dict[str, dict[str, torch.Tensor]] = {}
    for t in tensors:
        by_file.setdefault(t.file, {})[t.name] = t.to_torch()
    for file, group in by_file.items():
        save_file(group, str(folder / file), metadata={"format": "pt"})


# ── Serving dtypes ────────────────────────────────────────────────────────────────────────────────
# Which dtype each published tensor travels in: the serving dtype, "keep" (as stored, bit for
# bit) or the first matching per-tensor rule of ``sync.dtype_rules``.
#
# One function, ``serving_tensors``, decides for `tidal sync publish` and for the trainer's
# publisher alike. Integer and bool tensors always travel as they are (indices, masks, counters
# are never a serving choice). An fp8 tensor is never cast where the cast would change a value
# (e4m3fn -> e5m2, e8m0fnu -> float16) unless the rule that names it says ``lossy = true``: its
# scales were computed for its exact values.

KEEP = "keep"
"""The dtype name that means "as stored"."""
FP8_NAMES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
"""The 8-bit float formats torch may have; ``FP8_DTYPES`` holds those this torch has."""
FP8_DTYPES = tuple(d for d in (getattr(torch, n, None) for n in FP8_NAMES) if isinstance(d, torch.dtype))


def float_dtype(name: str) -> torch.dtype | None:
    """The floating torch dtype called ``name`` ("bfloat16", "float8_e4m3fn"), else None."""
    dtype = getattr(torch, name, None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else None


def check_dtype_name(name: str, extra: tuple[str, ...] = (KEEP,)) -> str:
    """``name`` if it is one of ``extra`` or a floating torch dtype; a ValueError saying what to
    write otherwise (pydantic turns it into a config error naming the field)."""
    if name in extra or float_dtype(name) is not None:
        return name
    fp8 = ", ".join(str(d).removeprefix("torch.") for d in FP8_DTYPES)
    raise ValueError(f"unknown dtype {name!r}: write {' or '.join(repr(e) for e in extra)} or a floating torch "
                     f"dtype (float32, bfloat16, float16, {fp8})")


class DtypeRule(Section):
    """One per-tensor rule of ``sync.dtype_rules`` (a TOML inline table)."""

    pattern: str = Field(min_length=1)
    """Glob over tensor names as stored in the checkpoint (fnmatch, case-sensitive: ``*`` any
    run of characters, ``?`` one, ``[ab]`` a set), e.g. "*.weight_scale*" or "*norm*". Rules
    are tried in order; the first that matches a tensor decides its dtype."""
    dtype: str
    """"keep" (the stored dtype, bit for bit) or a floating torch dtype name to cast the tensor
    to (float32, bfloat16, float16, float8_e4m3fn, float8_e5m2, ...). Integer and bool tensors
    are never cast."""
    lossy: bool = False
    """Allow this rule to cast an fp8 tensor to a dtype that cannot hold all of its values
    (e4m3fn -> e5m2, e8m0fnu -> float16). false = such a cast is an error naming the rule."""

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, v: str) -> str:
        return check_dtype_name(v)


@functools.cache
def exact_cast(src: torch.dtype, dst: torch.dtype) -> bool:
    """Whether every value of the 1-byte float ``src`` survives a cast to ``dst`` and back: all
    256 bit patterns are tried (NaNs count as kept when they come back NaN)."""
    patterns = torch.arange(256, dtype=torch.uint8)
    values = patterns.view(src)
    back = values.to(dst).to(src)
    same = back.view(torch.uint8) == patterns
    nan = values.float().isnan()
    return bool((same | (nan & back.float().isnan())).all())


def rule_for(name: str, rules: Sequence[DtypeRule]) -> tuple[int, DtypeRule] | None:
    """(index, rule) of the first rule whose pattern matches ``name``, else None."""
    return next(((i, r) for i, r in enumerate(rules) if fnmatchcase(name, r.pattern)), None)


def target_dtype(name: str, stored: torch.dtype, serving: str, rules: Sequence[DtypeRule] = ()) -> torch.dtype:
    """The dtype tensor ``name`` (stored as ``stored``) is published in."""
    if not stored.is_floating_point:
        return stored
    hit = rule_for(name, rules)
    wanted = hit[1].dtype if hit else serving
    target = stored if wanted == KEEP else float_dtype(wanted)
    if target is None:
        raise SyncError(f"unknown serving dtype {serving!r} (--dtype or sync.serving_dtype): write "
                        f"{KEEP!r} or a floating torch dtype such as bfloat16")
    if stored in FP8_DTYPES and target != stored and not (hit and hit[1].lossy) and not exact_cast(stored, target):
        what = (f"sync.dtype_rules.{hit[0]}.dtype (pattern {hit[1].pattern!r}) casts" if hit
                else f"the serving dtype {wanted!r} (--dtype or sync.serving_dtype) would cast")
        raise SyncError(f"{what} fp8 tensor {name} from {str(stored).removeprefix('torch.')} to {wanted}, "
                        f"which changes some of its values: add a rule {{pattern = ..., dtype = \"keep\"}} before "
                        f"it, or set lossy = true on a rule naming it")
    return target


def serving_tensors(tensors: Mapping[str, torch.Tensor], serving: str,
                    rules: Sequence[DtypeRule] = ()) -> dict[str, torch.Tensor]:
    """``tensors`` in the dtypes they are published in (``serving``: a floating dtype name or
    "keep"; ``rules``: ``sync.dtype_rules``). A tensor whose dtype stays is returned as it is
    (no copy)."""
    return {k: v.to(target_dtype(k, v.dtype, serving, rules)) for k, v in tensors.items()}


def serving_bits(tensors: list[TensorBits], serving: str, rules: Sequence[DtypeRule] = ()) -> list[TensorBits]:
    """``serving_tensors`` over a checkpoint read as bit patterns (`tidal sync publish`): a
    tensor whose dtype stays is the same object (its bytes as stored), the others are cast."""
    cast = serving_tensors({t.name: t.to_torch() for t in tensors}, serving, rules)
    return [t if cast[t.name].dtype == torch_dtype(t.dtype) else bits_of(t.name, cast[t.name], t.file)
            for t in tensors]
