"""The sandbox, attack by attack (threat model: src/tidal/sandbox/sandbox.py).

Every attack runs on every backend that works on this machine, both cold (a sandbox started
per run) and through the warm pool (a pre-started sandbox handed the program). A backend that
does not claim a
property (Sandbox.guarantees) is xfailed for that attack with the reason, without running it:
some attacks (kill -1, killing the test runner) would hurt the host if the property is absent.
"""

from __future__ import annotations

import glob
import logging
import os
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid

import pytest

from tidal.sandbox import Sandbox, SandboxConfig, SandboxError
from tidal.sandbox.workspace import TEMP_PREFIX, remove_tree

FAST = dict(timeout_s=3.0, cpu_s=2, memory_mb=256, max_processes=16, max_output_bytes=4096,
            max_file_bytes=64 << 10, concurrency=2)
SLACK_S = 2.0
"""Wall-clock slack on top of a limit: this machine is shared and often loaded."""


def subprocess_python() -> str:
    """As root, the subprocess backend runs programs as a fresh uid, which must be able to
    reach the interpreter; here the default one may live under /root (0700), so use the system
    interpreter when there is one. "" = the default (then the backend runs as root, and the
    properties that need a uid of its own are xfailed)."""
    if os.geteuid() != 0:
        return ""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(candidate):
            return candidate
    return ""


def make_config(backend: str, **overrides) -> SandboxConfig:
    """backend: "bwrap", "subprocess" or "auto", with "-warm" appended for a warm pool."""
    name, _, warm = backend.partition("-")
    python = subprocess_python() if name == "subprocess" else ""
    return SandboxConfig(**{"backend": name, "python": python, "warm_pool": 2 if warm else 0,
                            **FAST, **overrides})


def open_sandbox(backend: str, copy_on_write: str | None = None, **overrides):
    """Yield a Sandbox on ``backend`` (make_config's names), checked to layer rollouts in
    ``copy_on_write`` mode when one is given; skip the test, naming why, where it is unusable
    here. For module fixtures: ``yield from open_sandbox(...)``."""
    if copy_on_write is not None:
        overrides["copy_on_write"] = copy_on_write
    try:
        sandbox = Sandbox(make_config(backend, **overrides))
        if copy_on_write is not None:
            assert sandbox.copy_on_write_mode() == copy_on_write
    except SandboxError as e:
        where = backend if copy_on_write is None else f"{backend} with {copy_on_write} workspaces"
        pytest.skip(f"{where} unusable here: {e}")
    with sandbox:
        yield sandbox


@pytest.fixture(scope="module", params=["bwrap", "bwrap-warm", "subprocess", "subprocess-warm"])
def backend(request) -> str:
    try:
        Sandbox(make_config(request.param)).close()
    except SandboxError as e:
        pytest.skip(f"{request.param} backend unusable here: {e}")
    return request.param


@pytest.fixture(scope="module")
def sandbox(backend) -> Sandbox:
    with Sandbox(make_config(backend)) as sandbox:
        yield sandbox


def needs(sandbox: Sandbox, *properties: str) -> None:
    """xfail (without running the attack) unless the backend guarantees one of `properties`."""
    if not sandbox.guarantees & set(properties):
        pytest.xfail(f"the {sandbox.backend} backend here does not guarantee any of "
                     f"{properties} (see the threat model)")


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains marker (zombies have none)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and name != str(os.getpid()):
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(name))
            except (FileNotFoundError, ProcessLookupError):
                pass
    return found


@pytest.fixture
def host_dir():
    """A host directory outside any workspace, removed afterwards."""
    path = tempfile.mkdtemp(prefix="tidal-test-host-")
    yield path
    remove_tree(path)  # also undoes a chmod 000 a sandboxed program left behind


@pytest.fixture
def root_secret(host_dir):
    """A 0600 secret like an API key file: in /root when we are root, else in a private dir."""
    home = "/root" if os.geteuid() == 0 else host_dir
    path = os.path.join(home, f".tidal-test-secret-{uuid.uuid4().hex}")
    secret = uuid.uuid4().hex
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, secret.encode())
    os.close(fd)
    yield path, secret
    os.unlink(path)


def code(src: str) -> str:
    return textwrap.dedent(src)


# ---------------------------------------------------------------- ordinary programs


def test_normal_program(sandbox):
    r = sandbox.run_python("import sys\nprint(sum(range(10)))\nprint('note', file=sys.stderr)")
    assert (r.exit_code, r.stdout, r.stderr, r.killed_reason) == (0, "45\n", "note\n", None)
    assert 0 < r.wall_s < SLACK_S


def test_stdin_and_files(sandbox):
    r = sandbox.run_python(
        "import sys, helper\n"
        "print(helper.VALUE, sys.stdin.read().upper(), open('data/x.txt').read())",
        stdin="abc", files={"helper.py": "VALUE = 7\n", "data/x.txt": "hi"})
    assert (r.exit_code, r.stdout) == (0, "7 ABC hi\n"), r.stderr


def test_syntax_error(sandbox):
    r = sandbox.run_python("def f(:\n    pass\n")
    assert r.exit_code != 0 and r.killed_reason is None
    assert "SyntaxError" in r.stderr


def test_uncaught_exception_is_not_a_kill(sandbox):
    r = sandbox.run_python("raise ValueError('boom')")
    assert (r.exit_code, r.killed_reason) == (1, None)
    assert "ValueError: boom" in r.stderr


def test_file_names_must_stay_inside_the_workspace(sandbox, host_dir, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", host_dir)  # where fresh workspaces would appear
    for name in ("/etc/x", "../x", "a/../../x", ""):
        with pytest.raises(ValueError, match="relative path inside the workspace"):
            sandbox.run(["true"], files={"ok.txt": "x", name: "x"})
    assert os.listdir(host_dir) == []  # and no workspace was left behind


# ---------------------------------------------------------------- network


def test_network_is_unreachable(sandbox):
    needs(sandbox, "network")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    abstract = socket.socket(socket.AF_UNIX)
    abstract_name = f"\0tidal-test-{uuid.uuid4().hex}"
    abstract.bind(abstract_name)
    abstract.listen()
    port = listener.getsockname()[1]
    r = sandbox.run_python(code(f"""
        import socket
        def attempt(what, fn):
            try:
                fn()
                print(what, "REACHED")
            except OSError as e:
                print(what, "blocked", type(e).__name__)
        attempt("tcp", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=1))
        attempt("unix", lambda: socket.socket(socket.AF_UNIX).connect({abstract_name!r}))
        attempt("dns", lambda: socket.getaddrinfo("example.com", 80))
        attempt("internet", lambda: socket.create_connection(("1.1.1.1", 53), timeout=1))
    """))
    listener_got = _accepts(listener)
    listener.close()
    abstract.close()
    assert r.exit_code == 0, r.stderr
    assert "REACHED" not in r.stdout and r.stdout.count("blocked") == 4, r.stdout
    assert not listener_got


def _accepts(listener: socket.socket) -> bool:
    try:
        listener.accept()[0].close()
        return True
    except BlockingIOError:
        return False


# ---------------------------------------------------------------- host files


def test_cannot_read_world_readable_host_file(sandbox, host_dir):
    needs(sandbox, "filesystem")
    os.chmod(host_dir, 0o755)
    path = os.path.join(host_dir, "secret.txt")
    secret = uuid.uuid4().hex
    with open(path, "w") as f:
        f.write(secret)
    os.chmod(path, 0o644)
    r = sandbox.run_python(f"print(open({path!r}).read())")
    assert secret not in r.stdout + r.stderr
    assert r.exit_code != 0 and "Error" in r.stderr


def test_cannot_read_private_host_file(sandbox, root_secret):
    needs(sandbox, "filesystem", "user")
    path, secret = root_secret
    r = sandbox.run_python(code(f"""
        import os
        for attempt in ({path!r}, "/proc/self/root" + {path!r}):
            try:
                print(open(attempt).read())
            except OSError as e:
                print("blocked", type(e).__name__)
        try:
            print(os.listdir({os.path.dirname(path)!r}))
        except OSError as e:
            print("blocked", type(e).__name__)
    """))
    assert secret not in r.stdout + r.stderr
    assert os.path.basename(path) not in r.stdout  # bwrap may list /root: it holds only .pyenv
    assert r.stdout.startswith("blocked") and r.stdout.count("blocked") >= 2, r.stdout + r.stderr


def test_cannot_write_world_writable_host_dir(sandbox, host_dir):
    needs(sandbox, "filesystem")
    os.chmod(host_dir, 0o777)
    target = os.path.join(host_dir, "pwned")
    r = sandbox.run_python(f"open({target!r}, 'w').write('x')")
    assert not os.path.exists(target)
    assert r.exit_code != 0


def test_cannot_write_root_owned_dirs(sandbox):
    needs(sandbox, "filesystem", "user")
    targets = [f"/usr/tidal-pwned-{uuid.uuid4().hex}"]
    if os.geteuid() == 0:
        targets.append(f"/root/tidal-pwned-{uuid.uuid4().hex}")
    r = sandbox.run_python(code(f"""
        for target in {targets!r}:
            try:
                open(target, "w").write("x")
                print("WROTE", target)
            except OSError as e:
                print("blocked", type(e).__name__)
    """))
    for target in targets:
        assert not os.path.exists(target)
    assert r.stdout.count("blocked") == len(targets), r.stdout + r.stderr


def test_reused_workspace_symlink_is_not_followed(sandbox, host_dir):
    """A program plants `a.txt -> <host file>`; the next run's files must not write through it,
    and the caller's workspace is kept and handed back to its owner."""
    target = os.path.join(host_dir, "precious.txt")
    with open(target, "w") as f:
        f.write("original")
    workspace = os.path.join(host_dir, "ws")
    os.mkdir(workspace)
    owner = os.stat(workspace).st_uid
    plant = sandbox.run(["python3", "-c", f"import os; os.symlink({target!r}, 'a.txt'); "
                         "os.makedirs('d'); os.symlink('/', 'd/up')"], workspace=workspace)
    assert plant.exit_code == 0, plant.stderr
    assert os.path.islink(os.path.join(workspace, "a.txt"))
    r = sandbox.run(["cat", "a.txt", "d/up/b.txt"], files={"a.txt": "new ", "d/up/b.txt": "deep"},
                    workspace=workspace)
    assert (r.exit_code, r.stdout) == (0, "new deep"), r.stderr
    with open(target) as f:
        assert f.read() == "original"
    assert not os.path.exists("/b.txt")
    assert not os.path.islink(os.path.join(workspace, "a.txt"))
    assert {os.stat(os.path.join(d, n), follow_symlinks=False).st_uid
            for d, ds, fs in os.walk(workspace) for n in ds + fs} == {owner}


@pytest.mark.parametrize("given", [False, True])
def test_program_cannot_remove_its_workspace(sandbox, host_dir, monkeypatch, given):
    """The program may empty its workspace, but deleting or renaming it must fail (and chmod-ing
    it too, with a uid of its own); whatever it does, run() must not raise and a caller's
    workspace comes back as it was."""
    monkeypatch.setattr(tempfile, "tempdir", host_dir)  # keep anything that escapes in here
    os.chmod(host_dir, 0o777 | stat.S_ISVTX)  # a sticky, world-writable parent like /tmp
    workspace = os.path.join(host_dir, "ws") if given else None
    if given:
        os.mkdir(workspace, 0o750)
    program = code("""
        import os, shutil
        here = os.getcwd()
        os.makedirs("sub/deeper")
        os.chmod("sub", 0)
        os.chdir("/")
        for attempt in (lambda: shutil.rmtree(here), lambda: os.rename(here, here + ".moved"),
                        lambda: os.chmod(here, 0)):
            try:
                attempt()
                print("DID IT")
            except OSError as e:
                print("blocked", type(e).__name__)
    """)
    r = sandbox.run([sandbox.python, "prog.py"], files={"prog.py": program, "x.txt": "x"},
                    workspace=workspace)
    assert r.exit_code == 0, r.stderr
    deleted, renamed, chmodded = r.stdout.splitlines()
    if sandbox.guarantees & {"filesystem", "user"}:
        assert deleted.startswith("blocked") and renamed.startswith("blocked"), r.stdout
        if given:
            assert os.path.isdir(workspace) and os.stat(workspace).st_uid == os.getuid()
            assert stat.S_IMODE(os.stat(workspace).st_mode) == 0o750
    if "user" in sandbox.guarantees:
        assert chmodded.startswith("blocked"), r.stdout


def test_fresh_workspace_is_deleted(sandbox):
    marker = f"marker-{uuid.uuid4().hex}"
    r = sandbox.run_python(f"open({marker!r}, 'w').write('x'); import os; print(os.listdir('.'))")
    assert marker in r.stdout
    assert glob.glob(os.path.join(tempfile.gettempdir(), TEMP_PREFIX + "*", marker)) == []


# ---------------------------------------------------------------- resources


def test_fork_bomb(sandbox):
    needs(sandbox, "processes")
    marker = f"tidal-forkbomb-{uuid.uuid4().hex}"
    started = time.monotonic()
    r = sandbox.run([sandbox.python, "-c", f"import os\nwhile True:\n    os.fork()  # {marker}"])
    assert time.monotonic() - started < sandbox.cfg.timeout_s  # stopped by the limit, not the clock
    assert r.killed_reason == "processes", (r.killed_reason, r.stderr[-500:])
    assert processes_with(marker) == []


def test_process_limit_counts_processes_and_threads(sandbox):
    needs(sandbox, "processes")
    r = sandbox.run_python(code("""
        import os, threading, time
        started = 0
        try:
            for _ in range(100):
                if os.fork() == 0:
                    time.sleep(30)
                    os._exit(0)
                started += 1
        except BlockingIOError:
            pass
        print("processes", started, flush=True)
        threads = 0
        try:
            for _ in range(100):
                threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
                threads += 1
        except RuntimeError:
            pass
        print("threads", threads, flush=True)
        os._exit(0)
    """))
    counts = dict(line.split() for line in r.stdout.splitlines())
    assert int(counts["processes"]) == sandbox.cfg.max_processes - 1, r.stdout  # + itself
    assert int(counts["threads"]) == 0, r.stdout


def test_memory_hog(sandbox):
    limit = sandbox.cfg.memory_mb << 20
    r = sandbox.run_python(code(f"""
        chunks = []
        while sum(map(len, chunks)) < 2 * {limit}:
            chunks.append(bytearray(16 << 20))
        print("SURVIVED")
    """))
    assert "SURVIVED" not in r.stdout
    assert r.killed_reason == "memory", (r.killed_reason, r.stderr[-500:])


def test_infinite_loop_hits_wall_clock(backend):
    with Sandbox(make_config(backend, timeout_s=1.0, cpu_s=30)) as sandbox:
        r = sandbox.run_python("while True:\n    pass")
    assert (r.killed_reason, r.exit_code) == ("timeout", None)
    assert 1.0 <= r.wall_s < 1.0 + SLACK_S


def test_infinite_loop_hits_cpu_limit(backend):
    with Sandbox(make_config(backend, timeout_s=20.0, cpu_s=1)) as sandbox:
        r = sandbox.run_python("while True:\n    pass")
    assert r.killed_reason == "cpu", (r.killed_reason, r.exit_code, r.stderr)
    assert r.wall_s < 10.0  # well before the wall clock: the CPU limit stopped it


def test_timeout_keeps_output_printed_before_it(sandbox):
    r = sandbox.run_python("import time\nprint('started', flush=True)\ntime.sleep(60)")
    assert (r.killed_reason, r.stdout) == ("timeout", "started\n")


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_huge_output_is_capped(sandbox, stream):
    r = sandbox.run_python(f"import sys\nwhile True:\n    sys.{stream}.write('x' * 1000)")
    assert r.killed_reason == "output"
    assert len(getattr(r, stream)) == sandbox.cfg.max_output_bytes
    assert r.wall_s < SLACK_S


def test_huge_file(sandbox):
    size = 2 * sandbox.cfg.max_file_bytes
    r = sandbox.run_python(f"open('big', 'wb').write(b'x' * {size})")
    assert r.killed_reason == "file_size", (r.killed_reason, r.stderr[-300:])


# ---------------------------------------------------------------- processes


@pytest.fixture
def host_sleeper():
    """A host process holding a secret in its environment, like a trainer with an API key."""
    secret = f"sk-tidal-{uuid.uuid4().hex}"
    proc = subprocess.Popen(["sleep", "60"], env={"OPENAI_API_KEY": secret})
    yield proc, secret
    proc.kill()
    proc.wait()


def test_cannot_signal_host_processes(sandbox, host_sleeper):
    needs(sandbox, "pid", "user")
    sleeper, _ = host_sleeper
    r = sandbox.run_python(code(f"""
        import os, signal
        for pid in (os.getppid(), 1, {os.getpid()}, {sleeper.pid}, -1):
            try:
                os.kill(pid, signal.SIGKILL)
                print("sent", pid)
            except OSError as e:
                print("denied", pid, type(e).__name__)
        print("done")
    """))
    assert r.exit_code == 0 and r.stdout.endswith("done\n"), (r.stdout, r.stderr)
    assert sleeper.poll() is None  # the host process is alive (and so are we)
    assert sandbox.run_python("print('still works')").stdout == "still works\n"


def test_cannot_escape_through_proc(sandbox, host_sleeper, root_secret):
    needs(sandbox, "pid", "user")
    sleeper, env_secret = host_sleeper
    path, file_secret = root_secret
    r = sandbox.run_python(code(f"""
        attempts = ["/proc/{sleeper.pid}/environ", "/proc/1/environ", "/proc/{os.getpid()}/environ",
                    "/proc/1/root{path}", "/proc/{sleeper.pid}/root{path}"]
        for attempt in attempts:
            try:
                print(open(attempt, "rb").read())
            except OSError as e:
                print("blocked", type(e).__name__)
    """))
    assert env_secret not in r.stdout + r.stderr
    assert file_secret not in r.stdout + r.stderr


@pytest.mark.parametrize("keeps_pipes", [True, False])
def test_no_process_outlives_the_run(sandbox, keeps_pipes):
    needs(sandbox, "cleanup")
    marker = f"tidal-daemon-{uuid.uuid4().hex}"
    close = "" if keeps_pipes else "os.closerange(0, 3)"
    r = sandbox.run_python(code(f"""
        import os, sys, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                {close}
                daemon = "import time; open('ready', 'w').close(); time.sleep(60)  # {marker}"
                os.execv(sys.executable, [sys.executable, "-c", daemon])
            os._exit(0)
        os.wait()
        while not os.path.exists("ready"):  # the daemon is up, under its final command line
            time.sleep(0.01)
        print("parent done")
    """))
    assert (r.exit_code, r.stdout, r.killed_reason) == (0, "parent done\n", None), r.stderr
    assert r.wall_s < SLACK_S  # did not wait for the daemon
    assert processes_with(marker) == []


def test_host_environment_does_not_leak(sandbox, monkeypatch):
    secret = f"sk-tidal-{uuid.uuid4().hex}"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    r = sandbox.run_python("import os\nfor k, v in sorted(os.environ.items()):\n    print(k, v)")
    assert secret not in r.stdout
    keys = {line.split(" ", 1)[0] for line in r.stdout.splitlines()}
    assert keys <= {"PATH", "LANG", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED", "HOME", "TMPDIR",
                    "PWD"}, keys
    assert "PYTHONHASHSEED 0" in r.stdout


# ---------------------------------------------------------------- run_many and backend choice


def test_run_many_keeps_order_and_runs_concurrently(sandbox):
    sleeps = [0.6, 0.1, 0.4, 0.1]
    program = ("import sys, time\nt = time.time()\ntime.sleep({})\n"
               "print(sys.stdin.read(), t, time.time())")
    jobs = [(program.format(s), str(i)) for i, s in enumerate(sleeps)]
    results = sandbox.run_many(jobs)
    spans = []
    for i, r in enumerate(results):
        tag, start, end = r.stdout.split()
        assert (r.exit_code, tag) == (0, str(i))
        spans.append((float(start), float(end)))
    most_at_once = max(sum(s <= t < e for s, e in spans) for t, _ in spans)
    assert most_at_once == sandbox.cfg.concurrency
    assert sandbox.run_many([]) == []


def test_auto_prefers_bwrap_when_it_works():
    try:
        Sandbox(make_config("bwrap"))
    except SandboxError:
        pytest.skip("bwrap unusable here")
    assert Sandbox(make_config("auto")).backend == "bwrap"


def test_auto_falls_back_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="tidal.sandbox"):
        sandbox = Sandbox(make_config("auto", bwrap="/nonexistent/bwrap"))
    assert sandbox.backend == "subprocess"
    for words in ("NOT isolated", "network", "filesystem"):
        assert words in caplog.text


def test_unusable_bwrap_is_a_clear_error():
    with pytest.raises(SandboxError, match="backend='subprocess'"):
        Sandbox(make_config("bwrap", bwrap="/nonexistent/bwrap"))


def test_subprocess_backend_says_when_it_cannot_drop_root(caplog):
    python = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    reachable = all(os.stat(p).st_mode & stat.S_IXOTH
                    for p in _parents(python))
    if os.geteuid() != 0 or reachable:
        pytest.skip("needs root and a default interpreter under a private directory")
    with caplog.at_level(logging.WARNING, logger="tidal.sandbox"):
        sandbox = Sandbox(SandboxConfig(backend="subprocess"))
    assert "user" not in sandbox.guarantees and "AS ROOT" in caplog.text


def _parents(path: str) -> list[str]:
    parents = []
    while path != "/":
        path = os.path.dirname(path)
        parents.append(path)
    return parents
