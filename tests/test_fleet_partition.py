"""A region cut off for a while, then back, made for real: the remote pool's worker runs in its
own network namespace, joined to the trainer's by a veth pair, and the link drops every packet
(netem loss 100 % on both ends) for longer than a lease. test_fleet_remote.py makes the same
fault with a fault-injecting proxy; this one needs root and iproute2 (ip, tc), which CI has."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_fleet_remote import (
    SRC,
    TOKEN,
    assert_exactly_once,
    fleet_toml,
    records_if_any,
    wait_url,
)
from test_orchestrator import TINY, ckpt, records  # noqa: F401  (the module-scoped checkpoint fixture)

STEPS = 5
DROP_ALL = (("netem", "loss", "100%"), ("blackhole",))
"""tc qdiscs that drop every packet, tried in order."""


def missing() -> str | None:
    """What this machine lacks to make a network namespace, or None."""
    if os.geteuid() != 0:
        return f"root (os.geteuid() is {os.geteuid()}, not 0)"
    tools = [t for t in ("ip", "tc") if shutil.which(t) is None]
    return f"iproute2's {' and '.join(tools)} (apt-get install iproute2)" if tools else None


def sh(*cmd: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")


class Region:
    """A network namespace ``ns`` whose only way out is a veth pair: ``host_ip`` on ``host_dev``
    in the root namespace (where the trainer listens), ``worker_ip`` on ``worker_dev`` inside."""

    def __init__(self, tag: int):
        self.ns = f"tidal-part-{tag}"
        self.host_dev, self.worker_dev = f"tpt{tag}h", f"tpt{tag}w"  # under IFNAMSIZ (15)
        subnet = free_subnet(tag)
        self.host_ip, self.worker_ip = f"10.231.{subnet}.1", f"10.231.{subnet}.2"
        self.is_cut = False

    def up(self) -> None:
        sh("ip", "netns", "add", self.ns)
        sh("ip", "link", "add", self.host_dev, "type", "veth", "peer", "name", self.worker_dev)
        sh("ip", "link", "set", self.worker_dev, "netns", self.ns)
        sh("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.host_dev)
        sh("ip", "link", "set", self.host_dev, "up")
        sh("ip", "-n", self.ns, "addr", "add", f"{self.worker_ip}/24", "dev", self.worker_dev)
        sh("ip", "-n", self.ns, "link", "set", self.worker_dev, "up")
        sh("ip", "-n", self.ns, "link", "set", "lo", "up")

    def cut(self) -> None:
        """Every packet either way is dropped (a WAN partition: nothing refused, just silence):
        netem loss 100 %, or the blackhole qdisc on a kernel without netem (this machine's)."""
        for ns_args, dev in (((), self.host_dev), (("-n", self.ns), self.worker_dev)):
            errors = []
            for drop in DROP_ALL:
                try:
                    sh("tc", *ns_args, "qdisc", "add", "dev", dev, "root", *drop)
                    break
                except RuntimeError as e:
                    errors.append(str(e))
            else:
                raise RuntimeError("no qdisc that drops every packet: " + "; ".join(errors))
            self.is_cut = True

    def restore(self) -> None:
        """The link carries packets again (a qdisc not there is no error: cut may have failed half-way)."""
        subprocess.run(["tc", "qdisc", "del", "dev", self.host_dev, "root"], capture_output=True, check=False)
        subprocess.run(["tc", "-n", self.ns, "qdisc", "del", "dev", self.worker_dev, "root"],
                       capture_output=True, check=False)
        self.is_cut = False

    def popen(self, cmd: list[str], **kw) -> subprocess.Popen:
        return subprocess.Popen(["ip", "netns", "exec", self.ns, *cmd], **kw)

    def reaches(self, host: str, port: int, timeout_s: float = 1.0) -> bool:
        """Whether a TCP connection from inside the namespace to host:port opens."""
        probe = (f"import socket\ntry: socket.create_connection(({host!r}, {port}), timeout={timeout_s})\n"
                 "except OSError: raise SystemExit(1)")
        return subprocess.run(["ip", "netns", "exec", self.ns, sys.executable, "-c", probe],
                              capture_output=True, check=False, timeout=30).returncode == 0

    def down(self) -> None:
        """Remove the namespace and the veth pair (each step tolerates what is already gone)."""
        for cmd in (["ip", "netns", "del", self.ns], ["ip", "link", "del", self.host_dev]):
            subprocess.run(cmd, capture_output=True, check=False)


def free_subnet(tag: int) -> int:
    """A 10.231.N.0/24 no interface here has (sync_wan's namespaces use N = 0)."""
    used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, check=False).stdout
    for i in range(250):
        n = 1 + (tag + i) % 250
        if f"10.231.{n}." not in used:
            return n
    raise RuntimeError("no free 10.231.N.0/24 subnet")


def leftovers(r: Region) -> list[str]:
    """What of the region still exists."""
    nss = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout.split()
    out = [r.ns] if r.ns in nss else []
    for _ in range(50):  # the veth goes with its namespace, a moment later
        if subprocess.run(["ip", "link", "show", r.host_dev], capture_output=True, check=False).returncode != 0:
            return out
        time.sleep(0.1)
    return [*out, r.host_dev]


@pytest.fixture
def region(request):
    """A fresh Region, removed afterwards whatever happened (the finalizer is set before the
    first command, so a half-made region is removed too)."""
    lack = missing()
    if lack:
        pytest.fail(f"the partition test makes a real network namespace and needs {lack}; "
                    "run it as root on a machine with iproute2")
    r = Region(os.getpid() % 100_000)
    r.down()  # a leftover of an earlier run killed before its finalizer
    request.addfinalizer(r.down)
    r.up()
    yield r
    r.down()
    assert leftovers(r) == [], f"the namespace or veth outlived the test: {leftovers(r)}"


def wait_step(run: Path, step: int, train: subprocess.Popen, logs: Path, timeout_s: float = 90.0) -> None:
    deadline = time.time() + timeout_s
    while not any(r["step"] >= step for r in records_if_any(run, "step")):
        assert train.poll() is None, "tidal train ended early: " + tail(logs / "train.log")
        assert time.time() < deadline, f"step {step} never trained: " + tail(logs / "worker.log")
        time.sleep(0.05)


def tail(path: Path, n: int = 3000) -> str:
    return path.read_text(errors="replace")[-n:] if path.is_file() else "(no log)"


@pytest.mark.slow
def test_a_region_cut_off_for_real_then_back_loses_nothing_and_trains_nothing_twice(tmp_path, ckpt, region):  # noqa: F811
    lease_s = 2.0
    recipe = fleet_toml(tmp_path / "fleet.toml", ["far"], lease_s=lease_s, heartbeat_s=0.4,
                        listen=f"{region.host_ip}:0")
    run, logs = tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", "TIDAL_AUTO_DTYPE": "float32",
           "TIDAL_FLEET_TOKEN": TOKEN}
    with open(logs / "train.log", "w") as train_log, open(logs / "worker.log", "w") as worker_log:
        train = subprocess.Popen(
            [sys.executable, "-m", "tidal", "train", str(recipe), "--run-dir", str(run), "--model.init_from",
             str(ckpt), *TINY, "--orchestrator.steps", str(STEPS), "--engine.max_new_tokens", "32"],
            env=env, stdout=subprocess.DEVNULL, stderr=train_log)
        worker = None
        try:
            url = wait_url(run)
            assert f"//{region.host_ip}:" in url, url
            port = int(url.rstrip("/").rpartition(":")[2])
            worker = region.popen([sys.executable, "-m", "tidal", "worker", "--join", url, "--workers", "2"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=worker_log)
            wait_step(run, 1, train, logs)  # trained by the worker in the namespace: the link works
            region.cut()
            assert not region.reaches(region.host_ip, port), "the cut link still carries packets"
            time.sleep(2 * lease_s + 1)  # the leases expire meanwhile; what they held is re-queued
            region.restore()
            assert region.reaches(region.host_ip, port)
            assert train.wait(timeout=120) == 0, tail(logs / "train.log")
            assert worker.poll() is None, "the worker died: " + tail(logs / "worker.log")
        finally:
            if region.is_cut:
                region.restore()
            if worker is not None and worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
                worker.wait(30)
            if train.poll() is None:
                train.kill()
                train.wait()
    summary = json.loads((run / "summary.json").read_text())
    assert_exactly_once(run, SimpleNamespace(**summary), STEPS)
    fleet, remote = summary["fleet"], summary["fleet"]["remote"]
    left = [r for r in records(run, "membership") if r["event"] == "left"]
    assert fleet["left"] == len(left) >= 1  # the cut-off leases expired
    assert fleet["requeued"] == sum(r["requeued"] is not None for r in left)
    assert remote["leases_granted"] >= 2 + 1  # joined, then joined again once back
    assert remote["refused"].get("expired", 0) >= 1  # the worker was told why
    assert remote["refused_total"] == remote["refused"].get("expired", 0) + remote["refused"].get("unknown", 0)
    assert worker.returncode == 0, tail(logs / "worker.log")
