"""Task families with verifiable rewards, and grading of generated code in the sandbox."""

from tidal.tasks.family import Task, build_corpus, sample_tasks
from tidal.tasks.grading import Grade, grade_many

FAMILIES = {"funcs": sample_tasks}
"""Registered task families by name (env.name selects one)."""


def get_family(name: str):
    if name not in FAMILIES:
        raise ValueError(f"env.name {name!r} is not a known task family; choose one of {sorted(FAMILIES)}")
    return FAMILIES[name]


__all__ = ["FAMILIES", "Grade", "Task", "build_corpus", "get_family", "grade_many", "sample_tasks"]
