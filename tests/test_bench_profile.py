"""`tidal bench profile`: every phase of the main job profiled under both numerics modes."""

import json

from tidal.bench import profile_bench
from tidal.bench.config import main


def test_every_phase_is_profiled_side_by_side_with_its_top_ops(tmp_path, capsys):
    out = tmp_path / "profile.json"
    assert main(profile_bench, "profile", ["--quick", "--json", str(out), "--bench.top", "3"]) == 0
    result = json.loads(out.read_text())
    assert set(result["arms"]) == {"deterministic", "fast"}
    for arm in result["arms"].values():
        assert list(arm) == list(profile_bench.PHASES)
        for phase in arm.values():
            assert phase["wall_ms"] > 0 and 0 < phase["in_ops_ms"] <= phase["wall_ms"] * 1.05
            assert phase["op_calls"] > 0 and len(phase["top_ops"]) == 3
            shares = [op["share"] for op in phase["top_ops"]]
            assert shares == sorted(shares, reverse=True) and sum(shares) <= 1 + 1e-9
    printed = capsys.readouterr().out
    assert "ratio fast / deterministic wall time per phase" in printed and "RL trainer step" in printed
