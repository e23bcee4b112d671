"""`tidal sandbox exec`: one JSON line per command, and one clear error when it cannot run."""

from __future__ import annotations

import json
import os

import pytest

from tidal.cli import main


def exec_json(capsys, *args: str) -> dict:
    assert main(["sandbox", "exec", *args]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # exactly one line
    return json.loads(out)


def test_exec_prints_one_json_line(capsys):
    r = exec_json(capsys, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
    assert {k: r[k] for k in ("exit_code", "stdout", "stderr", "killed_reason")} == {
        "exit_code": 3, "stdout": "out\n", "stderr": "err\n", "killed_reason": None}
    assert r["wall_s"] > 0 and r["backend"] in ("bwrap", "subprocess")


def test_exec_timeout_and_output_cap(capsys):
    r = exec_json(capsys, "--timeout", "0.5", "--", "sleep", "30")
    assert (r["exit_code"], r["killed_reason"]) == (None, "timeout")
    r = exec_json(capsys, "--sandbox.max_output_bytes", "2048", "--", "sh", "-c",
                  "yes xxxxxxxx")
    assert r["killed_reason"] == "output" and len(r["stdout"]) == 2048


def test_exec_in_a_given_workspace(capsys, tmp_path):
    (tmp_path / "given.txt").write_text("here")
    r = exec_json(capsys, "--workspace", str(tmp_path), "--", "cat", "given.txt")
    assert (r["exit_code"], r["stdout"]) == (0, "here")
    assert os.path.isdir(tmp_path)


@pytest.mark.parametrize("args, words", [
    (["--sandbox.backend", "bwrap", "--sandbox.bwrap", "/nonexistent/bwrap", "--", "true"],
     "backend='bwrap' is unusable here"),
    (["--sandbox.python", "/nonexistent/python", "--", "true"], "is not an absolute path"),
    ([], "no command given"),
    (["--sandbox.memory_mb", "1", "--", "true"], "memory_mb"),
    (["--trainer.lr", "1", "--", "true"], "only --sandbox.KEY VALUE"),
])
def test_exec_error_is_one_clear_line(capsys, args, words):
    assert main(["sandbox", "exec", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("tidal sandbox: error:") and words in captured.err


def test_bench_sandbox_writes_the_keys(tmp_path, capsys):
    path = tmp_path / "sandbox.json"
    assert main(["bench", "sandbox", "--bench.runs", "2", "--bench.gap_ms", "0", "--bench.concurrency", "3",
                 "--bench.image_files", "3", "--env.sandbox.memory_mb", "384", "--json", str(path)]) == 0
    results = json.loads(path.read_text())
    assert results["plain"]["failures"] == 0 and results["plain"]["p50_ms"] > 0
    for name in ("bwrap", "bwrap_warm", "subprocess", "subprocess_warm"):
        if name in results["unavailable"]:
            continue
        r = results[name]
        assert r["failures"] == 0 and r["p99_ms"] >= r["p50_ms"] > 0
        assert (r["max_concurrent_ok"], r["concurrency_failures"]) == (3, {"3": 0})
    assert "subprocess" in results  # the fallback runs everywhere
    assert results["config"]["bench"]["concurrency"] == [3]
    pytest_image = results["pytest_image"]
    assert "unavailable" not in pytest_image, pytest_image  # (a pip failure says why)
    assert pytest_image["failures"] == 0 and pytest_image["p99_ms"] >= pytest_image["p50_ms"] > 0
    assert pytest_image["trivial_p50_ms"] > 0
    assert results["trace_overhead_ms"] == results["trace_on_p50_ms"] - results["trace_off_p50_ms"]
    assert results["config"]["env.sandbox"]["memory_mb"] == 384  # the run config's sandbox section
    assert "p50 ms" in capsys.readouterr().out
