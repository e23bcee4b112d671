"""`tidal sync publish | pull` end to end on loopback, and their exit status on user errors."""

import torch
from safetensors.torch import load_file

from tidal.cli import main
from tidal.model import build_model, preset, save_pretrained
from tidal.sync.origin import ServerThread, VersionStore, make_app


def test_publish_then_pull_writes_byte_identical_safetensors(tmp_path, capsys):
    model = build_model(preset("tiny"), seed=0)
    save_pretrained(model, tmp_path / "ck0")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p).sign() * 1e-4)
    save_pretrained(model, tmp_path / "ck1")
    root = tmp_path / "root"
    bf16 = ["--dtype", "bfloat16"]  # the default ("auto") depends on the machine
    assert main(["sync", "publish", str(tmp_path / "ck0"), "--root", str(root), *bf16]) == 0
    assert main(["sync", "publish", str(tmp_path / "ck1"), "--root", str(root), *bf16]) == 0
    assert "version 1 (delta on 0)" in capsys.readouterr().out
    server = ServerThread(make_app(VersionStore(root)))
    try:
        out = tmp_path / "out"
        assert main(["sync", "pull", "--upstream", server.url, "--out", str(out), "--version", "0"]) == 0
        assert main(["sync", "pull", "--upstream", server.url, "--out", str(out)]) == 0
        got = load_file(str(out / "v00000001" / "model.safetensors"))
        want = load_file(str(tmp_path / "ck1" / "model.safetensors"))
        assert got.keys() == want.keys()
        for k, v in want.items():
            assert got[k].dtype == torch.bfloat16
            assert torch.equal(got[k].view(torch.int16), v.to(torch.bfloat16).view(torch.int16))
        assert (out / "v00000001" / "config.json").read_bytes() == (tmp_path / "ck1" / "config.json").read_bytes()
        assert main(["sync", "pull", "--upstream", server.url, "--out", str(out), "--version", "7"]) == 2
        assert "version 7 cannot be built" in capsys.readouterr().err
    finally:
        server.stop()


def test_pull_from_a_dead_upstream_and_publish_of_a_non_checkpoint_exit_2(tmp_path, capsys):
    assert main(["sync", "pull", "--upstream", "http://127.0.0.1:1", "--out", str(tmp_path / "o")]) == 2
    assert "check the --upstream" in capsys.readouterr().err
    assert main(["sync", "publish", str(tmp_path), "--root", str(tmp_path / "r")]) == 2
    assert "no *.safetensors" in capsys.readouterr().err
