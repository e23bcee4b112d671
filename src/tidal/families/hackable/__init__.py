"""The "hackable" family: funcs' functions with a visible test file the naive reward runs, so
hard-coding, early exits and always-equal objects pay, while hidden tests graded sealed
(tidal.env.sealed) measure honest skill; canaries are impossible versions of its tasks. Built
for the integrity demonstration (issue 13): tasks.py, hacks.py, grader.py, corpus.py,
environment.py."""

from tidal.families.hackable.config import HackableConfig
from tidal.families.hackable.corpus import build_corpus, corpus_document, honest_body
from tidal.families.hackable.environment import (HackableEnvironment, hidden_tests_pass,
                                             load_environment)
from tidal.families.hackable.grader import VisibleRun, hidden_program, run_hidden, run_visible
from tidal.families.hackable.hacks import CORPUS_HACK_WEIGHTS, HACKS, hack_body
from tidal.families.hackable.tasks import (GENERATOR_VERSION, HackTask, make_canary, make_task,
                                       prompt_text, sample_tasks)

Config = HackableConfig
"""The model of ``env.args`` (tidal.env.registry validates them with it)."""

__all__ = ["CORPUS_HACK_WEIGHTS", "Config", "GENERATOR_VERSION", "HACKS", "HackTask",
           "HackableConfig", "HackableEnvironment", "VisibleRun", "build_corpus",
           "corpus_document", "hack_body", "hidden_program", "hidden_tests_pass", "honest_body",
           "load_environment", "make_canary", "make_task", "prompt_text", "run_hidden",
           "run_visible", "sample_tasks"]
