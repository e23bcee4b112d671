"""Base class for every component's Config: unknown keys are errors, values are validated."""

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A config section. ``extra="forbid"`` makes a misspelt key an error naming the key."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())
