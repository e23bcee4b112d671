"""`tidal doctor`: what this machine can do, and what tidal will therefore choose on it.

Prints the CPU and the ISA flags that decide bf16 speed, the environment caps (ONEDNN_MAX_CPU_ISA,
ATEN_CPU_CAPABILITY), the kernels ATen dispatches to, what oneDNN uses for a bf16 matmul (read
from ONEDNN_VERBOSE lines of a tiny matmul in a child process: torch has no call that names
oneDNN's ISA), whether bf16 is native, what dtype "auto" becomes, torch's thread count, and the
deterministic numerics' chosen paths (tidal.numerics.probe). ``--json PATH`` writes the same
record; its keys are DOCTOR_KEYS whatever the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

DOCTOR_KEYS = ("cpu", "isa", "env_caps", "aten", "onednn", "native_bf16", "bf16_reason", "auto_dtype",
               "threads", "deterministic_paths")
"""Top-level keys of `tidal doctor --json` (a test holds them fixed)."""

ISA_FLAGS = ("avx2", "avx512f", "avx512_core", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile")

BF16_MATMUL = "import torch; a = torch.randn(256, 256, dtype=torch.bfloat16); a @ a"
"""Big enough that torch sends it to oneDNN where oneDNN has a bf16 matmul (16x16 is not)."""


def onednn_bf16_matmul() -> dict[str, str | None]:
    """The ISA oneDNN runs on and the implementation it picks for a bf16 matmul, from a child
    process's ONEDNN_VERBOSE lines (this process's caps apply); None where oneDNN was not used."""
    env = {**os.environ, "ONEDNN_VERBOSE": "1"}
    out = subprocess.run([sys.executable, "-c", BF16_MATMUL], env=env, capture_output=True, text=True,
                         timeout=120).stdout
    isa = impl = None
    for line in out.splitlines():
        fields = line.split(",")
        if "info" in fields and "cpu" in fields and fields[-1].startswith("isa:"):
            isa = fields[-1].removeprefix("isa:")
        if "exec" in fields and "matmul" in fields and impl is None:
            impl = fields[fields.index("matmul") + 1]
    return {"isa": isa, "bf16_matmul": impl}


def deterministic_paths() -> list[dict]:
    """tidal.numerics.probe's report: each deterministic op's candidate paths, which hold here,
    what each costs, and the one the engine and the trainer run (fp32 and bf16)."""
    from tidal.numerics.probe import probe_report

    return probe_report()


def doctor_record() -> dict:
    import torch

    from tidal.hardware import cpu_facts, resolve_dtype

    f = cpu_facts()
    return {
        "cpu": {"vendor": f.vendor, "model_name": f.model_name},
        "isa": {flag: getattr(f, flag) for flag in ISA_FLAGS},
        "env_caps": {"ONEDNN_MAX_CPU_ISA": f.onednn_max_cpu_isa, "ATEN_CPU_CAPABILITY": f.aten_cpu_capability_env},
        "aten": {"capability": f.aten_capability, "levels": list(f.aten_levels)},
        "onednn": {
            "available": torch.backends.mkldnn.is_available(),
            "levels": list(f.onednn_levels),
            "bf16_kernels": torch.ops.mkldnn._is_mkldnn_bf16_supported(),  # native or emulated
            **onednn_bf16_matmul(),
        },
        "native_bf16": f.native_bf16,
        "bf16_reason": f.bf16_reason,
        "auto_dtype": resolve_dtype("auto"),
        "threads": torch.get_num_threads(),
        "deterministic_paths": deterministic_paths(),
    }


def _yes(b: bool) -> str:
    return "yes" if b else "no"


def format_record(r: dict) -> str:
    caps, dnn, aten = r["env_caps"], r["onednn"], r["aten"]
    if dnn["bf16_matmul"]:
        matmul = f"bf16 matmul {dnn['bf16_matmul']} on {dnn['isa']}"
    else:
        matmul = "bf16 matmul not run by oneDNN"
    lines = [
        f"cpu:                {r['cpu']['model_name'] or '?'} ({r['cpu']['vendor'] or '?'})",
        "isa flags:          " + ", ".join(f"{k} {_yes(v)}" for k, v in r["isa"].items()),
        "env caps:           " + ", ".join(f"{k}={v if v is not None else '(unset)'}" for k, v in caps.items()),
        f"aten:               {aten['capability']} (this CPU: {', '.join(aten['levels'])})",
        f"onednn:             {'available' if dnn['available'] else 'not available'}; "
        f"bf16 kernels (native or emulated) {_yes(dnn['bf16_kernels'])}; {matmul}",
        f"onednn levels:      {', '.join(dnn['levels']) or '(none known)'}",
        f"native bf16:        {_yes(r['native_bf16'])} ({r['bf16_reason']})",
        f'dtype "auto":       {r["auto_dtype"]}',
        f"torch threads:      {r['threads']}",
        "deterministic paths: op, dtype -> the path the engine and the trainer run; every candidate "
        "in order with its us per call at 16 rows, or where it broke (checked at threads "
        + ",".join(map(str, r["deterministic_paths"][0]["threads"])) + ")",
    ]
    for p in r["deterministic_paths"]:
        lines.append(_path_line(p))
    return "\n".join(lines)


def _path_line(p: dict) -> str:
    """One probed op: the path chosen (none: no candidate holds) and every candidate tried, in
    order, with whether it holds here, what it costs at 16 rows, or where it broke."""
    dtype = str(p["dtype"]).removeprefix("torch.")

    def candidate(c: dict) -> str:
        if not c["holds"]:
            return f"{c['path']} fails ({c['failure']})"
        return c["path"] + (f" {c['us_per_call']:.1f} us" if c["us_per_call"] is not None else "")

    tried = "; ".join(candidate(c) for c in p["candidates"])
    own = ", ".join(f"{shape} {path}" for shape, path in p.get("by_shape", {}).items())
    return (f"  {p['op']:<16} {dtype:<9} -> {p['path'] or 'NONE HOLDS':<16} {tried}"
            + (f"; by shape: {own}" if own else ""))


def cmd_doctor(args, rest) -> int:
    if rest:
        raise SystemExit(f"tidal doctor: unexpected arguments {rest}")
    record = doctor_record()
    print(format_record(record))
    if args.json:
        from tidal.fsutil import write_text_atomic

        write_text_atomic(Path(args.json), json.dumps(record, indent=2) + "\n")
        print(f"json: {args.json}")
    return 0


def add_parsers(sub) -> None:
    d = sub.add_parser("doctor", help="what this machine can do (CPU, ISA, bf16) and the dtypes tidal picks")
    d.add_argument("--json", metavar="PATH", help="also write the record as JSON to PATH")
    d.set_defaults(fn=cmd_doctor)
