"""`tidal bench sync`'s emulated wide-area link and its three transfers of one update.

    netns tsync-a (server side)                  netns tsync-b (client side)
    origin (tidal sync serve)   :8000  <──veth, tbf 1 Gbit/s each way──>  delay proxies
    http.server (full file)     :8001                                     (+25 ms each way,
    rsync daemon                :873                                       ~50 ms round trip)

Needs root, iproute2 (ip, tc) and rsync (`scripts/setup.sh --bench`); the benchmark reports
why it skipped this part when they are missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

NS_SERVER, NS_CLIENT = "tsync-a", "tsync-b"
SERVER_IP, CLIENT_IP = "10.231.0.1", "10.231.0.2"
PORTS = {"tidal": 8000, "full": 8001, "rsync": 873}
PROXY_BASE = 9000


def missing_tools() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "tc", "rsync"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (run scripts/setup.sh --bench)"
    return None


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def link_up(rate: str) -> None:
    link_down()
    sh("ip", "netns", "add", NS_SERVER)
    sh("ip", "netns", "add", NS_CLIENT)
    sh("ip", "link", "add", "tsync-va", "type", "veth", "peer", "name", "tsync-vb")
    for ns, dev, ip in ((NS_SERVER, "tsync-va", SERVER_IP), (NS_CLIENT, "tsync-vb", CLIENT_IP)):
        sh("ip", "link", "set", dev, "netns", ns)
        sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
        sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", "256kb",
           "latency", "100ms")


def link_down() -> None:
    for ns in (NS_SERVER, NS_CLIENT):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def start(ns: str, *cmd: str, wait_for: str | None = None) -> subprocess.Popen:
    proc = subprocess.Popen(["ip", "netns", "exec", ns, *cmd], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    if wait_for is not None:
        line = proc.stdout.readline()
        if wait_for not in line:
            proc.kill()
            raise RuntimeError(f"{cmd[:3]} did not start: {line!r}")
    return proc


def in_client(*cmd: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(["ip", "netns", "exec", NS_CLIENT, *cmd], check=True, capture_output=True, text=True)
    return time.perf_counter() - t0, out.stdout


def run_wan(origin_root: Path, files_dir: Path, rsync_base: Path, prev_version: int, version: int,
            rate: str = "1gbit", one_way_delay_s: float = 0.025) -> dict:
    """Deliver ``version`` (client holds ``prev_version``) three ways; seconds and bytes each."""
    py = sys.executable
    link_up(rate)
    procs = []
    try:
        conf = files_dir.parent / "rsyncd.conf"
        conf.write_text(f"[m]\npath = {files_dir}\nread only = yes\nuse chroot = no\nuid = root\ngid = root\n")
        procs.append(start(NS_SERVER, py, "-m", "tidal", "sync", "serve", "--root", str(origin_root),
                           "--port", str(PORTS["tidal"]), "--host", SERVER_IP, wait_for="serving"))
        procs.append(start(NS_SERVER, py, "-m", "http.server", str(PORTS["full"]), "--bind", SERVER_IP,
                           "--directory", str(files_dir)))
        procs.append(start(NS_SERVER, "rsync", "--daemon", "--no-detach", f"--config={conf}",
                           f"--address={SERVER_IP}", f"--port={PORTS['rsync']}"))
        for k, (name, port) in enumerate(PORTS.items()):
            procs.append(start(NS_CLIENT, py, "-m", "tidal.bench.sync_proxy", f"127.0.0.1:{PROXY_BASE + k}",
                               f"{SERVER_IP}:{port}", str(one_way_delay_s), wait_for="ready"))
        time.sleep(1.0)
        proxy = {name: PROXY_BASE + k for k, name in enumerate(PORTS)}
        _, out = in_client(py, "-m", "tidal.bench.sync_wan", "tidal-client",
                           f"http://127.0.0.1:{proxy['tidal']}", str(prev_version), str(version))
        tidal = json.loads(out)
        _, out = in_client(py, "-m", "tidal.bench.sync_wan", "full-client",
                           f"http://127.0.0.1:{proxy['full']}/model.safetensors")
        full = json.loads(out)
        rsync_s, out = in_client("rsync", "--stats", "--no-whole-file", "--ignore-times", f"rsync://127.0.0.1:{proxy['rsync']}/m/model.safetensors",
                                 str(rsync_base / "model.safetensors"))
        received = [line for line in out.splitlines() if line.startswith("Total bytes received")]
        rsync_bytes = int(received[0].split(":")[1].strip().replace(",", "")) if received else None
    finally:
        for p in procs:
            p.kill()
            p.wait()
        link_down()
    full_bits_per_s = full["bytes"] * 8 / full["seconds"]
    return {
        "tidal_s": tidal["seconds"], "tidal_bytes": tidal["bytes"],
        "full_s": full["seconds"], "full_bytes": full["bytes"],
        "rsync_s": rsync_s, "rsync_bytes_received": rsync_bytes,
        "wan_speedup_vs_full": full["seconds"] / tidal["seconds"],
        "wan_speedup_vs_rsync": rsync_s / tidal["seconds"],
        "full_link_utilisation": full_bits_per_s / parse_rate(rate),
    }


def parse_rate(rate: str) -> float:
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * scale
    return float(rate)


def tidal_client(url: str, prev_version: int, version: int) -> dict:
    """Hold ``prev_version`` (untimed), then time pulling ``version``: fetch, decode, verify."""
    from tidal.sync.puller import Puller

    puller = Puller([url])
    puller.pull(prev_version)
    before = puller.bytes_fetched
    t0 = time.perf_counter()
    puller.pull(version)
    return {"seconds": time.perf_counter() - t0, "bytes": puller.bytes_fetched - before}


def full_client(url: str) -> dict:
    import urllib.request

    t0 = time.perf_counter()
    total = 0
    with urllib.request.urlopen(url) as r:
        while data := r.read(1 << 20):
            total += len(data)
    return {"seconds": time.perf_counter() - t0, "bytes": total}


if __name__ == "__main__":
    if sys.argv[1] == "tidal-client":
        print(json.dumps(tidal_client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
    elif sys.argv[1] == "full-client":
        print(json.dumps(full_client(sys.argv[2])))
