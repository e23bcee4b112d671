"""The engine's prefix cache: free slots that still hold a finished sequence's keys/values
("parked"), and the lookup that gives a new prompt the parked slot sharing its longest prefix.
See the engine module docstring for how admission, compaction and weight updates treat them.
"""

from __future__ import annotations

from tidal.engine.slots import SlotState

PREFIX_BLOCK = 16
"""Parked sequences are matched by chained hashes of whole blocks of this many tokens (vLLM's
automatic prefix caching does the same), so a lookup compares a few hashes per parked slot
instead of hundreds of tokens; shorter shared prefixes are prefilled again."""


class PrefixCache:
    """Parked slots of ``state`` (``num_slots`` slots in all)."""

    def __init__(self, state: SlotState, num_slots: int):
        self._state = state
        self._num_slots = num_slots
        self.parked: dict[int, tuple[list[int], list[int]]] = {}
        """Free slot -> the tokens whose keys/values it still holds (a finished sequence but its
        last token, which was never fed) and their block hashes."""

    def park(self, slot: int, held: list[int]) -> None:
        """``slot`` is free and holds the keys/values of the tokens ``held``."""
        self.parked[slot] = (held, block_hashes(held))

    def clear(self) -> None:
        """Forget every parked slot (their keys/values are of old weights)."""
        self.parked.clear()

    def holds_any(self, slots: list[int]) -> bool:
        return any(slot in self.parked for slot in slots)

    def relabel(self, moved: dict[int, int]) -> None:
        """Parked caches whose rows moved (old slot -> new slot) now live at their new slots."""
        self.parked = {moved.get(k, k): v for k, v in self.parked.items()}

    def claim(self, slot: int, prompt: list[int], admitting_end: int) -> int:
        """Prepare free ``slot`` for ``prompt``: bring the parked slot sharing its longest
        prefix there (swapping rows). Returns how many prompt tokens it already holds (at most
        all but the last, whose logits the first token needs). Slots ``slot..admitting_end-1``
        are being filled now, so a displaced parked cache moves beyond them."""
        if not self.parked:
            return 0
        best, best_len = self._longest_prefix(prompt)
        best_len = min(best_len, len(prompt) - 1)
        if best_len < PREFIX_BLOCK:
            self._displace(slot, admitting_end)
            return 0
        del self.parked[best]
        if best != slot:
            self._state.swap([best], [slot])
            displaced = self.parked.pop(slot, None)  # now in best's old rows
            if displaced is not None:
                self.parked[best] = displaced
        return best_len

    def _longest_prefix(self, prompt: list[int]) -> tuple[int | None, int]:
        """The parked slot sharing the most whole blocks with ``prompt`` and how many tokens it
        shares (its whole blocks plus the shared start of the next block)."""
        best, best_blocks = None, 0
        wanted = block_hashes(prompt)
        for held_slot, (_, hashes) in self.parked.items():
            n = common_prefix(hashes, wanted)
            if n > best_blocks:
                best, best_blocks = held_slot, n
        best_len = 0
        if best is not None:
            held = self.parked[best][0]
            start = best_blocks * PREFIX_BLOCK
            if held[:start] == prompt[:start]:  # rules out a hash collision
                best_len = start + common_prefix(held[start: start + PREFIX_BLOCK],
                                                 prompt[start: start + PREFIX_BLOCK])
        return best, best_len

    def _displace(self, slot: int, admitting_end: int) -> None:
        """``slot`` is about to be overwritten: keep its parked cache in a free slot that holds
        nothing, if there is one, else drop it."""
        held = self.parked.pop(slot, None)
        if held is None:
            return
        for free in range(admitting_end, self._num_slots):
            if free not in self.parked:
                self._state.swap([slot], [free])
                self.parked[free] = held
                return


def block_hashes(tokens: list[int]) -> list[int]:
    """h[i] = hash of tokens[: (i + 1) * PREFIX_BLOCK] (chained), for every whole block."""
    out, h = [], 0
    for start in range(0, len(tokens) - PREFIX_BLOCK + 1, PREFIX_BLOCK):
        h = hash((h, *tokens[start: start + PREFIX_BLOCK]))
        out.append(h)
    return out


def common_prefix(a: list, b: list) -> int:
    """Length of the longest common prefix of two lists (slice comparisons run in C)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        mid = (low + high) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid
    return low
