"""The sandbox trace: what a program did, recorded by an audit hook inside its interpreter.

Why: integrity checking needs to know what an episode's programs executed, which files they
opened outside the workspace (or wrote), what they deleted or renamed, and every network
attempt, without trusting anything the program itself reports.

How: before the job's code runs, warm.BOOT installs `sys.addaudithook(HOOK)`, which writes one
JSON line per event (the schema of tidal.evidence.records.TraceEvent) to a pipe tidal passed
into the sandbox (an fd through bwrap, prlimit and setpriv). The supervisor reads that pipe
beside stdout and stderr (supervise.py) with its own cap (`max_trace_bytes`; beyond it lines
are read and dropped, so the program never blocks on a full pipe), and `parse_trace` turns it
into TraceEvents, skipping any line that is not a well-formed event. `trace_end` is written at
the interpreter's normal exit (atexit, in the booted process only).

Recorded audit events (CPython 3.11):
  exec      subprocess.Popen, os.system (as ["sh", "-c", cmd]), os.exec (every exec* attempt:
            execvp tries each PATH entry), os.posix_spawn
  open      open / os.open / io.open_code of a path outside the workspace, or any write-mode
            open, or a read of a protected file; reads under the interpreter's prefixes and the
            image's Python env (imports) are skipped
  remove    os.remove / os.unlink / os.rmdir / shutil.rmtree (calls with a dir_fd are skipped:
            they are rmtree's own steps, and rmtree is recorded once)
  rename    os.rename / os.replace
  connect   socket.connect / connect_ex / bind / sendto
  resolve   socket.getaddrinfo / gethostbyname / gethostbyname_ex / gethostbyaddr
  hostname  socket.gethostname. os.uname (and so platform.node()) raises no audit event and is
            NOT recorded.

Threat model: an in-process audit hook sees what the Python program does through Python. A
program can blind the trace by closing the fd (later events are lost; the hook checks the fd is
still its pipe, so it never writes into a file that reused the number), by exec-ing a non-Python
binary (the exec itself is recorded; what the binary does is not), or through ctypes / native
code. It cannot remove the hook (audit hooks cannot be removed) or unwrite a line already
written. It CAN write lines of its own to the fd (a forged event, or a forged trace_end), so a
trace is evidence of what was done, not proof of what was not; a missing trace_end (killed,
os._exit, fd closed, trace over its cap) is itself a clue.
"""

from __future__ import annotations

import json

from tidal.evidence.records import TRACE_KINDS, TraceEvent

STRING_FIELDS = ("path", "mode", "target", "address")
MAX_ARGV = 100
MAX_TEXT = 1000

HOOK = r'''
def _tidal_trace(fd, root, watch, skip):
    import atexit
    write, fstat, getpid, getcwd, fspath = os.write, os.fstat, os.getpid, os.getcwd, os.fspath
    norm = os.path.normpath
    inode = fstat(fd).st_ino
    me = getpid()
    table = {i: "\\u%04x" % i for i in range(32)}
    table[34], table[92] = '\\"', "\\\\"
    on = [True]
    def text(v):
        if isinstance(v, bytes):
            v = v.decode("utf-8", "surrogateescape")
        elif not isinstance(v, str):
            v = str(v)
        return '"' + v[:MAX_TEXT].translate(table) + '"'
    def emit(kind, fields):
        if not on[0]:
            return
        line = '{"kind":"' + kind + '"'
        for k, v in fields:
            line += ',"' + k + '":' + v
        line += "}\n"
        try:
            if fstat(fd).st_ino != inode:
                raise OSError
            write(fd, line.encode("utf-8", "replace"))
        except OSError:
            on[0] = False
    def where(p):
        p = fspath(p)
        if isinstance(p, bytes):
            p = p.decode("utf-8", "surrogateescape")
        if not p.startswith("/"):
            p = getcwd() + "/" + p
        if "/." in p or "//" in p:  # (normpath costs more than the rest of an event)
            p = norm(p)
        if root != "/workspace" and (p == root or p.startswith(root + "/")):
            p = "/workspace" + p[len(root):]
        return p
    def inside(p):
        return p == "/workspace" or p.startswith("/workspace/")
    def mode_of(mode, flags):
        if isinstance(mode, str):
            for m in ("x", "a", "w"):
                if m in mode:
                    return m
            return "r+" if "+" in mode else "r"
        flags = flags or 0
        if flags & os.O_APPEND:
            return "a"
        if flags & os.O_CREAT and flags & os.O_EXCL:
            return "x"
        if flags & (os.O_CREAT | os.O_TRUNC) or flags & 3 == os.O_WRONLY:
            return "w"
        return "r+" if flags & 3 == os.O_RDWR else "r"
    def argv_of(args):
        if isinstance(args, (str, bytes)):
            args = [args]
        return "[" + ",".join(text(a) for a in list(args)[:MAX_ARGV]) + "]"
    def address(a):
        if isinstance(a, tuple) and len(a) >= 2:
            host = a[0].decode() if isinstance(a[0], bytes) else str(a[0])
            return text(("[%s]:%s" if ":" in host else "%s:%s") % (host, a[1]))
        return text(a)
    def on_open(args):
        path, mode, flags = args
        if isinstance(path, int):
            return
        p = where(path)
        m = mode_of(mode, flags)
        if m == "r":
            if p in watch:
                pass
            elif inside(p) or p.startswith(skip):
                return
        emit("open", (("path", text(p)), ("mode", text(m))))
    def on_remove(args):
        if args[-1] is None or args[-1] == -1:  # no dir_fd
            emit("remove", (("path", text(where(args[0]))),))
    def on_rename(args):
        if args[2] in (None, -1) and args[3] in (None, -1):
            emit("rename", (("path", text(where(args[0]))), ("target", text(where(args[1])))))
    def exec_of(i):
        return lambda args: emit("exec", (("argv", argv_of(args[i])),))
    handlers = {
        "open": on_open,
        "os.remove": on_remove, "os.rmdir": on_remove, "shutil.rmtree": on_remove,
        "os.rename": on_rename,
        "subprocess.Popen": exec_of(1), "os.exec": exec_of(1), "os.posix_spawn": exec_of(1),
        "os.system": lambda args: emit("exec", (("argv", argv_of(["sh", "-c", args[0]])),)),
        "socket.connect": lambda args: emit("connect", (("address", address(args[1])),)),
        "socket.bind": lambda args: emit("connect", (("address", address(args[1])),)),
        "socket.sendto": lambda args: emit("connect", (("address", address(args[1])),)),
        "socket.getaddrinfo": lambda args: emit("resolve", (("address", text(args[0])),)),
        "socket.gethostbyname": lambda args: emit("resolve", (("address", text(args[0])),)),
        "socket.gethostbyname_ex": lambda args: emit("resolve", (("address", text(args[0])),)),
        "socket.gethostbyaddr": lambda args: emit("resolve", (("address", text(args[0])),)),
        "socket.gethostname": lambda args: emit("hostname", ()),
    }
    get = handlers.get
    def hook(event, args):
        handler = get(event)
        if handler is not None:
            try:
                handler(args)
            except Exception:
                pass
    sys.addaudithook(hook)
    atexit.register(lambda: getpid() == me and emit("trace_end", ()))
'''.replace("MAX_TEXT", str(MAX_TEXT)).replace("MAX_ARGV", str(MAX_ARGV))
"""Source of the hook installer BOOT runs (a function: its names stay out of __main__)."""


def parse_trace(data: bytes) -> list[TraceEvent]:
    """The well-formed events in `data` (JSON lines); anything else is skipped, never raised."""
    events = []
    for line in data.split(b"\n"):
        event = _event(line)
        if event is not None:
            events.append(event)
    return events


def _event(line: bytes) -> TraceEvent | None:
    if not line.strip():
        return None
    try:
        data = json.loads(line.decode("utf-8", "replace"))
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("kind") not in TRACE_KINDS:
        return None
    if any(not isinstance(data.get(k, ""), str) for k in STRING_FIELDS):
        return None
    argv = data.get("argv", [])
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        return None
    return TraceEvent(kind=data["kind"], argv=tuple(argv),
                      **{k: data[k] for k in STRING_FIELDS if k in data})
