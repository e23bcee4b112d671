"""Copy-on-write rollout workspaces over a task image, and the warm pool's fresh sandboxes.

The attacks themselves (network, host files, fork bombs...) run through the warm pool in
test_sandbox.py; here: what a rollout writes never reaches the image or another rollout, a
rollout keeps its own changes across runs, each limit is named in killed_reason inside a
rollout, and a warm sandbox is fresh, used once, and leaves nothing behind.
"""

from __future__ import annotations

import glob
import os
import tempfile
import uuid

import pytest

from tidal.sandbox import Sandbox, SandboxError, TaskImage
from tidal.sandbox.reasons import killed_reason
from tidal.sandbox.warm import WARM_MARKER, Job, Place
from tidal.sandbox.workspace import TEMP_PREFIX
from test_sandbox import make_config, open_sandbox, processes_with

IMAGE_FILES = {"README": "task\n", "src/app.py": "VALUE = 1\n", "src/lib/util.py": "X = 2\n"}

# (backend, copy_on_write) -> how rollouts layer over the image on that backend
LAYOUTS = [("bwrap-warm", "overlay"), ("bwrap", "overlay"), ("bwrap-warm", "copy"),
           ("subprocess-warm", "copy")]


@pytest.fixture(scope="module", params=LAYOUTS, ids=lambda p: f"{p[0]}-{p[1]}")
def sandbox(request):
    yield from open_sandbox(*request.param)


@pytest.fixture
def image():
    with TaskImage.from_files(IMAGE_FILES) as image:
        yield image


def image_state(image: TaskImage) -> dict[str, str]:
    state = {}
    for dirpath, _, filenames in os.walk(image.path):
        for name in filenames:
            path = os.path.join(dirpath, name)
            with open(path) as f:
                state[os.path.relpath(path, image.path)] = f.read()
    return state


def tree(rollout) -> str:
    r = rollout.run(["sh", "-c", "find . -type f | sort | while read f; do echo \"$f=$(cat $f)\"; "
                     "done"])
    assert r.exit_code == 0, r.stderr
    return r.stdout


def test_writes_never_reach_the_image_or_another_rollout(sandbox, image):
    with sandbox.rollout(image) as first, sandbox.rollout(image) as second:
        untouched = tree(second)
        r = first.run(["sh", "-c", "echo changed >> src/app.py && rm README && "
                       "rm -r src/lib && echo new > fresh.txt && mkdir -p d && echo x > d/y"])
        assert r.exit_code == 0, r.stderr
        assert tree(second) == untouched
        assert "README" not in tree(first) and "./src/app.py=VALUE = 1\nchanged" in tree(first)
    assert image_state(image) == IMAGE_FILES


def test_rollout_keeps_its_changes_across_runs(sandbox, image):
    with sandbox.rollout(image) as rollout:
        r = rollout.run_python("import src.app; print(src.app.VALUE)",
                               files={"src/app.py": "VALUE = 41\n"})
        assert (r.exit_code, r.stdout) == (0, "41\n"), r.stderr
        r = rollout.run_python("open('note', 'w').write('from run 2')")
        assert r.exit_code == 0, r.stderr
        r = rollout.run(["cat", "note", "src/app.py", "README"])
        assert (r.exit_code, r.stdout) == (0, "from run 2VALUE = 41\ntask\n"), r.stderr


def test_a_deleted_image_dir_stays_deleted_when_refilled(sandbox, image):
    """Writing files into a directory the rollout deleted must not bring back the image's."""
    with sandbox.rollout(image) as rollout:
        assert rollout.run(["rm", "-r", "src"]).exit_code == 0
        r = rollout.run(["find", "src", "-type", "f"], files={"src/only.py": "x"})
        assert (r.exit_code, r.stdout) == (0, "src/only.py\n"), r.stderr


def test_program_cannot_reach_the_image_on_the_host(sandbox, image):
    if "filesystem" not in sandbox.guarantees and "user" not in sandbox.guarantees:
        pytest.xfail("this backend runs programs as tidal's own user, which owns the image")
    target = os.path.join(image.path, "src", "app.py")
    with sandbox.rollout(image) as rollout:
        rollout.run_python(f"open({target!r}, 'w').write('PWNED')\n"
                           f"open({image.path + '/planted'!r}, 'w').write('x')")
    assert image_state(image) == IMAGE_FILES


def test_closing_a_rollout_removes_its_layer_and_processes(sandbox, image):
    marker = f"tidal-rollout-daemon-{uuid.uuid4().hex}"
    rollout = sandbox.rollout(image)
    layer = rollout._dir
    rollout.run_python("import os, sys\nif os.fork() == 0:\n    os.setsid()\n"
                       f"    os.execv(sys.executable, [sys.executable, '-c', 'import time; "
                       f"time.sleep(60)  # {marker}'])\n")
    rollout.close()
    assert processes_with(marker) == []
    assert not os.path.exists(layer)  # (its own layer: other processes may be making theirs)
    with pytest.raises(ValueError, match="closed"):
        rollout.run(["true"])


LIMIT_PROGRAMS = {
    "timeout": "import time\ntime.sleep(30)",
    "cpu": "while True:\n    pass",
    "memory": "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))",
    "output": "while True:\n    print('x' * 1000)",
    "processes": "import os\nwhile True:\n    os.fork()",
    "file_size": "open('big', 'wb').write(b'x' * (4 << 20))",
    None: "print('fine')",
}


@pytest.mark.parametrize("reason", list(LIMIT_PROGRAMS), ids=str)
def test_each_limit_is_named_in_a_rollout(backend_for_limits, image, reason):
    if reason == "processes" and "processes" not in backend_for_limits.guarantees:
        pytest.xfail("this backend has no per-run process limit")
    with backend_for_limits.rollout(image) as rollout:
        r = rollout.run_python(LIMIT_PROGRAMS[reason])
    assert r.killed_reason == reason, (r.killed_reason, r.exit_code, r.stderr[-300:])
    if reason in ("timeout", "output"):
        assert r.exit_code is None
    elif reason != "processes":  # a throttled fork bomb ends by itself or fills the output cap
        assert r.exit_code is not None


def test_the_process_limits_evidence_outranks_the_output_cap():
    """A fork bomb's throttled children each die with a BlockingIOError traceback; when those
    fill the output cap, the run is named for the process limit, not for its output."""
    throttled = ("Traceback (most recent call last):\n  File \"<string>\", line 3, in <module>\n"
                 "BlockingIOError: [Errno 11] Resource temporarily unavailable\n")
    assert killed_reason("output", 137, throttled * 400, 0.5, 1) == "processes"
    assert killed_reason("output", 137, "x" * 65536, 0.5, 1) == "output"
    assert killed_reason("timeout", 137, throttled, 0.5, 1) == "processes"
    assert killed_reason(None, 0, throttled, 0.5, 1) is None  # caught, printed, exited 0


@pytest.fixture(scope="module", params=["bwrap-warm", "subprocess-warm"])
def backend_for_limits(request):
    """1 s of CPU and 8 s of wall clock: the spinning program must hit the CPU limit well before
    the wall clock even on a loaded machine (at a load of 10 on 2 cores, 1 s of CPU took more
    than 3 s of wall clock), the sleeper the wall clock."""
    try:
        sandbox = Sandbox(make_config(request.param, timeout_s=8.0, cpu_s=1))
    except SandboxError as e:
        pytest.skip(f"{request.param} unusable here: {e}")
    with sandbox:
        yield sandbox


# ---------------------------------------------------------------- the warm pool


@pytest.fixture(scope="module", params=["bwrap-warm", "subprocess-warm"])
def warm(request):
    yield from open_sandbox(request.param)


def test_runs_go_to_a_prestarted_sandbox(warm):
    look = f"print({WARM_MARKER.encode()!r} in open('/proc/self/cmdline', 'rb').read())"
    assert warm.run_python(look).stdout == "True\n"
    assert Sandbox(make_config(warm.backend, trace=False)).run_python(look).stdout == "False\n"
    assert Sandbox(make_config(warm.backend)).run_python(look).stdout == "True\n"  # traced: BOOT
    argv = "import os, sys; print(sys.argv, __name__, __file__ == os.path.abspath('main.py'), " \
           "sys.path[0] == os.getcwd())"
    cold = Sandbox(make_config(warm.backend)).run_python(argv)
    assert cold.stdout == "['main.py'] __main__ True True\n" == warm.run_python(argv).stdout


def test_warm_sandboxes_are_fresh_and_never_reused(warm):
    leave_behind = ("import builtins, os\nbuiltins.LEFT = 1\nos.environ['LEFT'] = '1'\n"
                    "open('left.txt', 'w').write('x')\nprint(os.getcwd(), sorted(os.listdir('.')))")
    look = ("import builtins, os, sys\nprint(hasattr(builtins, 'LEFT'), 'LEFT' in os.environ, "
            "sorted(os.listdir('.')), sys.stdin.read())")
    for _ in range(3):  # more runs than the pool holds: replacements are fresh too
        first = warm.run_python(leave_behind)
        assert first.exit_code == 0 and "left.txt" in first.stdout, first.stderr
        second = warm.run_python(look, stdin="in")
        assert second.stdout == "False False ['main.py'] in\n", second.stdout + second.stderr


def test_a_warm_sandbox_that_died_while_waiting_is_replaced(warm):
    starter = warm._starter
    slot = starter.start(Place())
    slot.launched.stop()  # killed while waiting for its program...
    os.waitid(os.P_PID, slot.launched.proc.pid, os.WEXITED | os.WNOWAIT)  # ...and gone
    r = starter.run(Job(code="print('ran')"), Place(), slot)
    assert (r.exit_code, r.stdout) == (0, "ran\n"), r.stderr


def test_closing_the_pool_leaves_nothing(warm, monkeypatch):
    for future in list(warm._pool._ready):  # the fixture's own pool starts nothing meanwhile
        future.result()
    private = tempfile.mkdtemp(prefix="tidal-test-tmp-")  # only this test's workspaces in it
    os.chmod(private, 0o755)  # reachable by a run's own uid, as /tmp is
    monkeypatch.setattr(tempfile, "tempdir", private)
    workspaces = os.path.join(private, TEMP_PREFIX + "*")
    before = set(glob.glob(workspaces))
    sandbox = Sandbox(make_config(warm.backend + "-warm", warm_pool=3))
    assert sandbox.run_python("print(1)").stdout == "1\n"
    waiting = [future.result().launched.proc for future in sandbox._pool._ready]
    ours = set(glob.glob(workspaces)) - before
    assert len(waiting) == 3 and len(ours) == 3  # each waiting sandbox has its workspace
    sandbox.close()
    assert not set(glob.glob(workspaces)) & ours
    assert all(proc.returncode is not None for proc in waiting)  # reaped
    with pytest.raises(RuntimeError, match="closed"):
        sandbox.run_python("print(1)")
    os.rmdir(private)  # empty: nothing of the pool's is left in it
