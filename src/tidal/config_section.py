"""Base class for every component's Config: unknown keys are errors, values are validated.

A dtype field declared ``DtypeName`` (or ``Annotated[str, AUTO_DTYPE]``) may be ``"auto"``: the
section resolves it when validated (``tidal.hardware.resolve_dtype``: bfloat16 where this machine
computes bf16 natively, float32 elsewhere), so every component reads a concrete dtype, and it
remembers that the value came from "auto" (``requested_dtype``), so a recipe written back out
(``tidal train --dry-run``) still says "auto" and resolves afresh on another machine.
"""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, PrivateAttr, model_validator


class _AutoDtype:
    """Field marker: this field's "auto" is resolved for this machine at validation."""

    def __repr__(self) -> str:
        return "AUTO_DTYPE"


AUTO_DTYPE = _AutoDtype()

DtypeName = Annotated[Literal["auto", "float32", "bfloat16"], AUTO_DTYPE]
"""A compute or parameter dtype a config chooses: "auto" (by what the machine can do) or explicit."""


class Section(BaseModel):
    """A config section. ``extra="forbid"`` makes a misspelt key an error naming the key."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=(),
                              use_attribute_docstrings=True)

    _auto_dtypes: dict[str, str] = PrivateAttr(default_factory=dict)
    """Dtype fields that were "auto", each with the dtype "auto" chose."""

    @model_validator(mode="after")
    def _resolve_auto_dtypes(self):
        for name in self.auto_dtype_fields():
            if getattr(self, name) == "auto":
                from tidal.hardware import resolve_dtype  # lazy: torch, only where a dtype is auto

                resolved = resolve_dtype("auto")
                self._auto_dtypes = {**self._auto_dtypes, name: resolved}
                self.__dict__[name] = resolved  # not setattr: that would validate again
        return self

    def __eq__(self, other) -> bool:
        """Equal when every field holds the same value: a dtype that came from "auto" equals the
        same dtype named explicitly (both compute the same; only a recipe written back differs)."""
        if not isinstance(other, BaseModel):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    @classmethod
    def auto_dtype_fields(cls) -> tuple[str, ...]:
        """This section's fields that accept "auto"."""
        return tuple(n for n, f in cls.model_fields.items() if any(m is AUTO_DTYPE for m in f.metadata))

    def requested_dtype(self, name: str) -> str:
        """What the config asked for in dtype field ``name``: "auto" while the field still holds
        the dtype "auto" chose, else the (explicit) value."""
        value = getattr(self, name)
        return "auto" if self._auto_dtypes.get(name) == value else value
