"""Test-wide settings: one torch thread and passive OpenMP waiting.

The tests run tiny models whose matmuls take microseconds; on a 2-core machine shared with the
sandbox subprocesses, a second OpenMP thread spin-waits and makes steps 2-10x slower.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# dtype "auto" means fp32 in tests on every CPU (native bf16 or not), so a machine with native bf16
# checks the same numbers as one without; tests that need bf16 ask for it by name.
os.environ["TIDAL_AUTO_DTYPE"] = "float32"

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Per test, because the code under test may change the thread count (the RL driver sets
    run.trainer_threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
