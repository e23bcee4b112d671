"""Tensors as bit patterns: every dtype is viewed as unsigned integers of its width, so the codec
and the hashes never do float arithmetic (NaN payloads, -0.0 and subnormals stay exact)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

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
        from tidal.sync.errors import SyncError

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
