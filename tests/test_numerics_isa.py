"""The bitwise numerics suite (tests/test_numerics.py) at every instruction-set level this machine
supports, each in its own process: oneDNN honours ``ONEDNN_MAX_CPU_ISA`` and ATen honours
``ATEN_CPU_CAPABILITY`` only when they are set before the first kernel runs. A machine with more
features so also checks what lesser machines of its kind will do (capping an AMD EPYC with
native bf16 at AVX512_CORE is an Intel Xeon without it, for oneDNN)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tidal.hardware import cpu_facts

SUITE = Path(__file__).with_name("test_numerics.py")


def isa_levels() -> list[tuple[str, str]]:
    """(ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY) pairs this CPU can run: scalar ATen over AVX2
    oneDNN, AVX2, AVX-512 and, where present, native bf16 and AMX."""
    facts = cpu_facts()
    onednn, aten = set(facts.onednn_levels), set(facts.aten_levels)
    pairs = [("AVX2", "default"), ("AVX2", "avx2"), ("AVX512_CORE", "avx512"),
             ("AVX512_CORE_BF16", "avx512"), ("AVX512_CORE_AMX", "avx512")]
    return [(d, a) for d, a in pairs if d in onednn and a in aten]


@pytest.mark.slow
@pytest.mark.parametrize("onednn,aten", isa_levels(), ids=lambda v: v)
def test_bitwise_suite_holds_at_this_instruction_set_level(onednn, aten):
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": onednn, "ATEN_CPU_CAPABILITY": aten}
    check = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
        env=env, capture_output=True, text=True, check=True)
    assert check.stdout.strip().lower() == aten, check.stdout  # the cap reached the process
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(SUITE)],
        env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"{onednn}/{aten}:\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}"


def test_this_machine_has_at_least_two_levels_to_test():
    """Every x86-64 machine of this kind has AVX2 and AVX-512: the cross-level check is real."""
    assert len(isa_levels()) >= 2, cpu_facts()
