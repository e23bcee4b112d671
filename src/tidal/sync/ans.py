"""Entropy coding of symbol streams with an empirical (per-chunk) table, by rANS (constriction).

The table is the sorted distinct values with their counts; the decoder rebuilds the identical
probability model from it, so what is coded is the order-0 empirical entropy plus the table.
"""

from __future__ import annotations

import numpy as np
import constriction

Categorical = constriction.stream.model.Categorical
AnsCoder = constriction.stream.stack.AnsCoder


def _model(counts: np.ndarray) -> Categorical:
    probabilities = counts.astype(np.float64) / float(counts.sum())
    return Categorical(probabilities, perfect=False)


def ans_encode(symbols: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``symbols`` (indices into ``counts``) -> compressed uint32 words. Needs len(counts) >= 2."""
    coder = AnsCoder()
    coder.encode_reverse(symbols.astype(np.int32, copy=False), _model(counts))
    return coder.get_compressed()


def ans_decode(words: np.ndarray, counts: np.ndarray, n: int) -> np.ndarray:
    coder = AnsCoder(words)
    return coder.decode(_model(counts), n)
