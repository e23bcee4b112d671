"""tidal's supervision of `vllm serve` (engine.remote.launch) and the vllm / sglang reply
formats, without vLLM: a fake server (tests/fake_vllm.py) that speaks the protocol. Also: the
GPU check script parses, and its CPU part (the random Qwen3-MoE folder) loads back."""

from __future__ import annotations

import ast
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tidal.bench.online_server import free_port
from tidal.config import load_config
from tidal.engine import GenerationRequest
from tidal.engine.remote import kinds
from tidal.engine.remote.build import RemoteSetup, remote_engine
from tidal.engine.vllm_server import VllmServer, VllmServerError, vllm_command
from tidal.model.checkpoint import from_pretrained, save_pretrained
from tidal.model.presets import preset
from tidal.model.qwen3 import build_model
from tidal.model.tokenizer import ByteTokenizer

ROOT = Path(__file__).resolve().parents[1]
FAKE = [sys.executable, str(ROOT / "tests" / "fake_vllm.py")]


def config(tmp_path, port: int, **remote):
    overrides = ["--engine.backend", "remote", "--engine.remote.kind", "vllm",
                 "--engine.remote.url", f"http://127.0.0.1:{port}",
                 "--engine.remote.weights_dir", str(tmp_path / "served"),
                 "--engine.remote.launch", "true", "--engine.remote.launch_command",
                 json.dumps(FAKE), "--engine.remote.startup_timeout_s", "60",
                 "--engine.remote.retry_backoff_s", "0.05", "--engine.max_seq_len", "128",
                 "--engine.max_new_tokens", "8", "--trainer.router_replay", "off"]
    for k, v in remote.items():
        overrides += [f"--engine.remote.{k}", str(v)]
    return load_config(None, overrides)


@pytest.fixture
def checkpoint(tmp_path):
    save_pretrained(build_model(preset("tiny"), seed=0), tmp_path / "ck", ByteTokenizer())
    return tmp_path / "ck"


def test_the_command_line_serves_the_folder_with_tidals_logprob_convention(tmp_path):
    cfg = config(tmp_path, 8123, launch_args=json.dumps(["--gpu-memory-utilization", "0.5"]))
    cmd = vllm_command(cfg.engine.remote, 128, "bfloat16", seed=7)
    assert cmd[:3] == [*FAKE, str(tmp_path / "served")]
    flags = dict(zip(cmd[3::2], cmd[4::2]))
    assert flags["--port"] == "8123" and flags["--host"] == "127.0.0.1"
    assert flags["--dtype"] == "bfloat16" and flags["--max-model-len"] == "128"
    assert flags["--logprobs-mode"] == "processed_logprobs" and flags["--seed"] == "7"
    assert cmd[-2:] == ["--gpu-memory-utilization", "0.5"]


def test_a_launched_server_generates_reloads_new_versions_and_is_restarted_when_it_dies(
        tmp_path, checkpoint):
    cfg = config(tmp_path, free_port())
    engine = remote_engine(RemoteSetup.of(cfg), str(checkpoint), "")
    try:
        server = engine.supervisor
        assert server.healthy() and (tmp_path / "served" / "config.json").is_file()
        engine.load_weights(from_pretrained(checkpoint), 0)  # writes the folder, then reloads
        req = GenerationRequest([1, 10], temperature=0.0, stop=[])
        first = engine.generate([req])[0]
        assert first.token_ids == [12, 13, 14, 15, 16, 17, 18, 19]
        assert first.logprobs == [-0.25] * 8 and first.versions == [0] * 8
        assert first.finish_reason == "length"
        # a new version: the folder changes, the server reloads it, the outputs follow
        model = from_pretrained(checkpoint)
        engine.write_folder = lambda m, v: _write_generation(tmp_path / "served", m, v)
        engine.load_weights(model, 1)
        second = engine.generate([req])[0]
        assert second.token_ids[0] == 13 and second.versions == [1] * 8
        # kill -9: the supervisor starts it again on the same folder (the newest version)
        os.killpg(server.proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not (server.restarts == 1 and server.healthy()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.restarts == 1
        again = engine.generate([req])[0]
        assert again.token_ids == second.token_ids
    finally:
        engine.close()
    assert server.proc.poll() is not None


def _write_generation(folder: Path, model, version: int) -> None:
    from tidal.engine.remote.build import write_version

    write_version(model, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "fake_generation": version}))


def test_a_server_that_cannot_start_is_a_clear_error(tmp_path, checkpoint):
    server = VllmServer([sys.executable, "-c", "raise SystemExit(3)"],
                        f"http://127.0.0.1:{free_port()}/health", tmp_path / "log", 30)
    with pytest.raises(VllmServerError, match="exited with code 3 before it was healthy"):
        server.start()
    cfg = config(tmp_path, free_port(), launch_command=json.dumps(["no-such-vllm-binary"]))
    with pytest.raises(VllmServerError, match="pip install tidal\\[vllm\\]"):
        remote_engine(RemoteSetup.of(cfg), str(checkpoint), "")


def test_vllm_and_sglang_replies_map_to_tidals_finish_reasons():
    eos = 257
    vllm = {"choices": [{"token_ids": [5, eos], "logprobs": {"token_logprobs": [-1.0, -2.0]},
                         "finish_reason": "stop", "stop_reason": None}]}
    r = kinds.parse_reply("vllm", vllm, eos)
    assert (r.token_ids, r.logprobs, r.finish_reason, r.version) == ([5, eos], [-1.0, -2.0], "eos", None)
    vllm["choices"][0]["stop_reason"] = "\n\n"
    assert kinds.parse_reply("vllm", vllm, eos).finish_reason == "stop"
    sglang = {"meta_info": {"output_token_logprobs": [[-0.5, 7, None], [-0.75, 8, None]],
                            "finish_reason": {"type": "length", "length": 2},
                            "weight_version": "4"}}
    r = kinds.parse_reply("sglang", sglang, eos)
    assert (r.token_ids, r.logprobs, r.finish_reason, r.version) == ([7, 8], [-0.5, -0.75], "length", 4)
    with pytest.raises(kinds.ReplyError, match="engine.remote.kind"):
        kinds.parse_reply("tidal", vllm, eos)
    assert kinds.update_calls("sglang", 3, "", "http", "/w") == [
        ("/update_weights_from_disk", {"model_path": "/w", "weight_version": "3"})]
    with pytest.raises(kinds.ReplyError, match="refused"):
        kinds.check_update("sglang", {"success": False, "message": "bad"})


@pytest.mark.slow  # the deterministic engine and trainer forward of a 4-layer MoE
def test_the_gpu_check_script_parses_and_builds_a_qwen3_moe_folder(tmp_path):
    source = (ROOT / "scripts" / "gpu" / "check_vllm.py").read_text()
    ast.parse(source)
    sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
    try:
        import check_vllm
    finally:
        sys.path.pop(0)
    folder = check_vllm.build_moe_folder(tmp_path / "moe")
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"] and cfg["num_experts"] > 1
    model = from_pretrained(folder)
    assert model.config.is_moe
    # its comparison on the CPU: tidal's deterministic engine against the trainer's forward
    cfg = check_vllm.config(tmp_path / "served", free_port(), "float32")
    engine, model = check_vllm.tidal_engine(folder, "float32", cfg)
    local = engine.generate(check_vllm.requests()[:4])
    metrics = check_vllm.compare("tidal", local, model)
    assert metrics["tokens"] == 4 * check_vllm.NEW_TOKENS
    assert metrics["bitwise_equal_fraction"] == 1.0 and metrics["routing"]["flip_rate"] == 0.0
