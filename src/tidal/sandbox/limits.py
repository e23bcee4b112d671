"""What a sandboxed program inherits from the host: rlimits, a uid, an environment.

The limits and the privilege drop are applied by two util-linux tools put in front of the
program's argv (`prlimit ... -- setpriv ... -- argv`), not by a Python `preexec_fn`:

- `preexec_fn` runs Python in a forked child and can deadlock when other threads hold locks;
  `run_many` launches from threads.
- Under bwrap the limits must be set *inside* the user namespace: RLIMIT_NPROC set before bwrap
  would also cap the host-wide count of the caller's processes (measured on kernel 6.18).
- The two execs cost about 2 ms (measured); a Python shim would cost an interpreter start
  (~10 ms).

RLIMIT_NPROC does not bind root (the kernel exempts uid 0), so when tidal runs as root every run
gets a fresh random uid (`new_sandbox_uid`): the count is then the run's own processes, the
program cannot touch root-owned files or processes, and whatever still runs as that uid after
the run can be found and killed. When tidal is not root, bwrap's user namespace makes the count
per run; the plain-subprocess backend then sets no NPROC (it would count all of the caller's
processes) and cannot stop a fork bomb.
"""

from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass

from tidal.sandbox.config import SandboxConfig
from tidal.sandbox.errors import SandboxError

SANDBOX_UIDS = (1 << 30, 1 << 31)
"""Range the per-run uid is drawn from: far above /etc/passwd users and subuid ranges, so a
collision with a real account or another run is negligible (one in ~10^9 per pair of runs)."""

PROGRAM_LANG = "C.UTF-8"


@dataclass(frozen=True)
class Tools:
    prlimit: str
    setpriv: str


def find_tools() -> Tools:
    """Locate prlimit and setpriv (util-linux), resolved to real paths."""
    found = {name: shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")
             for name in ("prlimit", "setpriv")}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        raise SandboxError(
            f"the sandbox needs {' and '.join(missing)} from util-linux to set limits and drop "
            "privileges; install util-linux (apt-get install util-linux)"
        )
    return Tools(os.path.realpath(found["prlimit"]), os.path.realpath(found["setpriv"]))


def new_sandbox_uid() -> int:
    """A fresh uid (also used as gid) for one run; see the module docstring for why."""
    low, high = SANDBOX_UIDS
    return low + secrets.randbelow(high - low)


def confine_argv(tools: Tools, cfg: SandboxConfig, uid: int | None,
                 nproc: int | None) -> list[str]:
    """`prlimit <limits> -- setpriv <privileges> --`: prefix that confines the argv after it.

    uid: switch to this uid/gid with no groups and no capabilities (requires running as root).
    nproc: RLIMIT_NPROC, or None for none (only meaningful when the count is per run, see above).
    """
    limits = [
        f"--cpu={cfg.cpu_s}:{cfg.cpu_s + 1}",  # SIGXCPU at cpu_s, SIGKILL one second later
        f"--as={cfg.memory_mb << 20}",
        f"--fsize={cfg.max_file_bytes}",
        "--core=0",
    ]
    if nproc is not None:
        limits.append(f"--nproc={nproc}")
    privileges = ["--nnp", "--pdeathsig=KILL"]
    if uid is not None:
        privileges = [f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                      "--inh-caps=-all", "--bounding-set=-all", *privileges]
    return [tools.prlimit, *limits, "--", tools.setpriv, *privileges, "--"]


def program_env(python: str, home: str) -> dict[str, str]:
    """The program's whole environment: fixed, so host secrets (API keys, tokens) never leak."""
    return {
        "PATH": f"{os.path.dirname(python)}:/usr/local/bin:/usr/bin:/bin",
        "LANG": PROGRAM_LANG,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "HOME": home,
        "TMPDIR": home,
    }
