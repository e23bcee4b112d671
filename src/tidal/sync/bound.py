"""The order-0 entropy bound of one update's change pattern (the yardstick of the codec).

Per tensor of n elements of which c changed (p = c/n): n·H(p) bits to say which changed, plus
c times the empirical entropy of the changed elements' new − old bit-pattern differences (as
integers of the element's width). Summed over tensors, in bytes.
"""

from __future__ import annotations

import numpy as np


def binary_entropy_bits(p: float) -> float:
    if p <= 0.0 or p >= 1.0:
        return 0.0
    return float(-p * np.log2(p) - (1 - p) * np.log2(1 - p))


def empirical_entropy_bits(values: np.ndarray) -> float:
    """Total bits (count × entropy) of ``values`` under their own empirical distribution."""
    if values.size == 0:
        return 0.0
    _, counts = np.unique(values, return_counts=True)
    probs = counts / values.size
    return float(-(counts * np.log2(probs)).sum())


def tensor_bound_bits(old: np.ndarray, new: np.ndarray) -> tuple[float, int]:
    """(bound in bits, changed elements) for one tensor's bit patterns."""
    changed = np.flatnonzero(old != new)
    n = old.size
    bits = n * binary_entropy_bits(changed.size / n) if n else 0.0
    return bits + empirical_entropy_bits(new[changed] - old[changed]), int(changed.size)
