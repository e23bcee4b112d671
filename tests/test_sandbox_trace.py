"""The sandbox trace (tidal.sandbox.trace): what a program did, as TraceEvents.

Each traced action must appear exactly once with the right fields on every backend, cold and
warm; a program that ends without the interpreter's normal exit has no trace_end; and a program
that writes garbage to the trace pipe, closes it or floods it neither breaks its run nor the
parse.
"""

from __future__ import annotations

import pytest

from tidal.evidence.records import TraceEvent
from tidal.sandbox import Sandbox, TaskImage
from tidal.sandbox.trace import parse_trace
from test_sandbox import code, make_config, open_sandbox

ACTIONS = code("""
    import os, socket
    try:
        open("/etc/passwd").read()
    except OSError:
        pass
    open("out.txt", "w").write("x")
    open("gone.txt", "w").close()
    os.remove("gone.txt")
    os.rename("out.txt", "kept.txt")
    os.system("true")
    s = socket.socket()
    s.settimeout(0.5)
    try:
        s.connect(("1.1.1.1", 80))
    except OSError:
        pass
    s.close()
    socket.gethostname()
    print("done")
""")
EXPECTED = [
    TraceEvent("open", path="/etc/passwd", mode="r"),
    TraceEvent("open", path="/workspace/out.txt", mode="w"),
    TraceEvent("open", path="/workspace/gone.txt", mode="w"),
    TraceEvent("remove", path="/workspace/gone.txt"),
    TraceEvent("rename", path="/workspace/out.txt", target="/workspace/kept.txt"),
    TraceEvent("exec", argv=("sh", "-c", "true")),
    TraceEvent("connect", address="1.1.1.1:80"),
    TraceEvent("hostname"),
    TraceEvent("trace_end"),
]
FIND_FD = code("""
    import os, stat
    fd = next(n for n in range(3, 256)
              if _ok(n) and stat.S_ISFIFO(os.fstat(n).st_mode))
""")
OK = "import os\ndef _ok(n):\n    try:\n        os.fstat(n)\n        return True\n    except OSError:\n        return False\n"


@pytest.fixture(scope="module", params=["bwrap", "bwrap-warm", "subprocess", "subprocess-warm"])
def sandbox(request):
    yield from open_sandbox(request.param)


def test_each_action_is_recorded_once(sandbox):
    r = sandbox.run_python(ACTIONS)
    assert (r.exit_code, r.stdout) == (0, "done\n"), r.stderr
    assert r.trace == EXPECTED


def test_os_exit_leaves_no_trace_end(sandbox):
    r = sandbox.run_python("import os\nopen('a', 'w').close()\nos._exit(0)")
    assert r.exit_code == 0, r.stderr
    assert r.trace == [TraceEvent("open", path="/workspace/a", mode="w")]


def test_an_uncaught_exception_still_ends_the_trace(sandbox):
    r = sandbox.run_python("raise ValueError('x')")
    assert r.exit_code == 1 and r.trace == [TraceEvent("trace_end")]


def test_garbage_on_the_trace_pipe_does_not_break_the_run(sandbox):
    junk = b'garbage\n{not json\n\xff\xfe\n[1]\n{"kind": "nope"}\n{"kind": "open", "path": 3}\n'
    garbage = OK + FIND_FD + f"os.write(fd, {junk!r})\nopen('after.txt', 'w').close()\nprint('ran')"
    r = sandbox.run_python(garbage)
    assert (r.exit_code, r.stdout) == (0, "ran\n"), r.stderr
    assert r.trace == [TraceEvent("open", path="/workspace/after.txt", mode="w"),
                       TraceEvent("trace_end")]


def test_a_closed_trace_records_nothing_more_and_writes_nowhere_else(sandbox):
    program = (OK + FIND_FD + "os.close(fd)\n"
               "f = os.open('x', os.O_WRONLY | os.O_CREAT)\nos.dup2(f, fd)\n"
               "open('y', 'w').close()\nos.close(f)\nos.close(fd)\n"
               "print(repr(open('x').read()))")
    r = sandbox.run_python(program)
    assert (r.exit_code, r.stdout) == (0, "''\n"), r.stderr
    assert r.trace == []  # blinded, and so no trace_end either


def test_a_flood_is_capped_and_the_run_goes_on(sandbox):
    flood = OK + FIND_FD + "line = b'{\"kind\": \"hostname\"}\\n'\nfor _ in range(120000):\n" \
        "    os.write(fd, line)\nprint('ran')"
    r = sandbox.run_python(flood)
    assert (r.exit_code, r.stdout, r.killed_reason) == (0, "ran\n", None), r.stderr
    cap = sandbox.cfg.max_trace_bytes // len('{"kind": "hostname"}\n')
    assert 0 < len(r.trace) <= cap and TraceEvent("trace_end") not in r.trace


def test_tracing_off_gives_no_trace(sandbox):
    with Sandbox(make_config(sandbox.backend, trace=False)) as quiet:
        r = quiet.run_python("print(1)")
        assert (r.exit_code, r.stdout, r.trace) == (0, "1\n", None), r.stderr
        with TaskImage.from_files({"a": "b"}) as image, quiet.rollout(image) as rollout:
            r = rollout.run_python("print(open('a').read())")
            assert (r.exit_code, r.stdout, r.trace, rollout.trace) == (0, "b\n", None, []), r


def test_a_rollout_gathers_its_runs_traces(sandbox):
    with TaskImage.from_files({"a.txt": "a"}, protected=["a.txt"]) as image, \
            sandbox.rollout(image) as rollout:
        rollout.run_python("open('a.txt').read()")
        r = rollout.run(["true"])
        assert r.trace == [TraceEvent("exec", argv=("true",), run=1)]  # just the exec
        rollout.run_python("import os\nos.remove('main.py')")
    assert [(e.run, e.kind, e.path) for e in rollout.trace] == [
        (0, "open", "/workspace/a.txt"), (0, "trace_end", ""), (1, "exec", ""),
        (2, "remove", "/workspace/main.py"), (2, "trace_end", "")]


def test_parse_trace_keeps_what_parses():
    data = b'{"kind": "exec", "argv": ["a", 1]}\n\xff\n{"kind": "open", "path": "/x", "mode": "r"}'
    assert parse_trace(data) == [TraceEvent("open", path="/x", mode="r")]
    assert parse_trace(b"") == [] and parse_trace(b"\n\n{") == []
