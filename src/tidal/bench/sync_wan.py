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
        # TCP buffers well above the emulated bandwidth-delay product (1 Gbit/s x 50 ms = 6.25 MB),
        # so no side is window-limited (the per-namespace TCP settings; best effort).
        for key, value in (("net.ipv4.tcp_rmem", "4096 131072 33554432"),
                           ("net.ipv4.tcp_wmem", "4096 131072 33554432")):
            subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", f"{key}={value}"], capture_output=True)


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
        tidal = subscribed_delivery(py, origin_root, f"http://127.0.0.1:{proxy['tidal']}", prev_version, version)
        cli_s = cli_delivery(py, f"http://127.0.0.1:{proxy['tidal']}", files_dir.parent / "wan-cli-out",
                             prev_version, version)
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
    rate_bits = parse_rate(rate)
    sub = tidal["subscribed"]
    print_timeline("tidal, subscribed (publish -> applied)", sub, sub["published"])
    print_timeline("tidal, polled (pull call -> applied)", tidal["polled"], tidal["polled"]["request_sent"])
    print_timeline("full snapshot over HTTP (request -> verified)", full, full["request_sent"])
    tidal_s = sub["applied"] - sub["published"]
    full_s = full["verified"] - full["request_sent"]
    return {
        "tidal_s": tidal_s, "tidal_bytes": tidal["bytes"],
        "tidal_polled_s": tidal["polled"]["applied"] - tidal["polled"]["request_sent"],
        "tidal_cli_pull_s": cli_s,
        "full_s": full_s, "full_bytes": full["bytes"],
        "rsync_s": rsync_s, "rsync_bytes_received": rsync_bytes,
        "wan_speedup_vs_full": full_s / tidal_s,
        "wan_speedup_vs_rsync": rsync_s / tidal_s,
        "wan_speedup_vs_full_polled": full_s / (tidal["polled"]["applied"] - tidal["polled"]["request_sent"]),
        "full_link_utilisation": full["bytes"] * 8 / (full["last_byte"] - full["first_byte"]) / rate_bits,
        "full_link_utilisation_incl_request": full["bytes"] * 8 / full_s / rate_bits,
    }


STAGES = ("published", "request_sent", "first_byte", "last_byte", "decode_done", "hash_done", "applied", "verified")


def print_timeline(title: str, stamps: dict, zero: float) -> None:
    """One delivery's stages in milliseconds after ``zero``."""
    parts = [f"{k} {1000 * (stamps[k] - zero):+.1f}" for k in STAGES if k in stamps]
    print(f"  {title:<46} " + ", ".join(parts) + " ms")


def subscribed_delivery(py: str, origin_root: Path, url: str, prev_version: int, version: int) -> dict:
    """A subscriber holding ``prev_version`` waits; the version is then published (LATEST moves;
    its forms were written beforehand, the encode is not part of delivery); the subscriber's
    timeline is taken relative to that moment. Then a second, polling puller (same warm
    connections) pulls the same version, timed from its call."""
    from tidal.fsutil import write_atomic

    latest = origin_root / "LATEST"
    write_atomic(latest, str(prev_version).encode())
    proc = subprocess.Popen(["ip", "netns", "exec", NS_CLIENT, py, "-m", "tidal.bench.sync_wan", "tidal-client",
                             url, str(prev_version), str(version)], stdout=subprocess.PIPE, text=True)
    try:
        if "ready" not in proc.stdout.readline():
            raise RuntimeError("the tidal client did not start")
        time.sleep(0.5)  # its subscription is waiting at the origin
        write_atomic(latest, str(version).encode())
        published = time.time()
        result = json.loads(proc.stdout.readline())
    finally:
        proc.wait(timeout=120)
    result["subscribed"]["published"] = published
    return result


def cli_delivery(py: str, url: str, out: Path, prev_version: int, version: int) -> float:
    """`tidal sync pull` to disk: the folder holds ``prev_version`` (untimed), then the command
    that brings it to ``version`` is timed whole (process start, reading and re-verifying the
    held version, transfer, apply, writing safetensors)."""
    shutil.rmtree(out, ignore_errors=True)
    in_client(py, "-m", "tidal", "sync", "pull", "--upstream", url, "--out", str(out), "--version", str(prev_version))
    seconds, _ = in_client(py, "-m", "tidal", "sync", "pull", "--upstream", url, "--out", str(out),
                           "--version", str(version))
    shutil.rmtree(out, ignore_errors=True)
    return seconds


def parse_rate(rate: str) -> float:
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * scale
    return float(rate)


def tidal_client(url: str, prev_version: int, version: int) -> None:
    """Two pullers hold ``prev_version`` (untimed); one subscribes and gets ``version`` when it
    is published, then the other pulls it by an ordinary call. Prints both timelines."""
    from tidal.sync.pull import Puller

    subscriber, poller = Puller([url]), Puller([url])
    subscriber.pull(prev_version)
    poller.pull(prev_version)
    before = subscriber.bytes_fetched
    print("ready", flush=True)
    got = subscriber.pull_next(wait_s=10.0)
    if got != version:
        raise SystemExit(f"subscriber got version {got}, expected {version}")
    subscribed = dict(subscriber.timeline)
    poller.pull(version)
    print(json.dumps({"subscribed": subscribed, "polled": dict(poller.timeline),
                      "bytes": subscriber.bytes_fetched - before}), flush=True)


def full_client(url: str) -> dict:
    """GET the safetensors file and BLAKE3 it as it streams in (verification by the hash the
    tidal side checks; hashing overlaps the transfer, which it outpaces ~40x)."""
    import urllib.request

    import blake3

    digest = blake3.blake3()
    stamps = {"request_sent": time.time()}
    total = 0
    with urllib.request.urlopen(url) as r:
        while data := r.read(1 << 20):
            stamps.setdefault("first_byte", time.time())
            total += len(data)
            digest.update(data)
    stamps["last_byte"] = time.time()
    digest.hexdigest()
    stamps["verified"] = time.time()
    return {**stamps, "bytes": total}


if __name__ == "__main__":
    if sys.argv[1] == "tidal-client":
        tidal_client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif sys.argv[1] == "full-client":
        print(json.dumps(full_client(sys.argv[2])))
