"""What this machine can do, and the dtype a config's ``"auto"`` means on it.

    facts = cpu_facts()                  # cached: vendor, ISA flags, env caps, ATen's choice
    resolve_dtype("auto")                # "bfloat16" where bf16 is native, else "float32"

Machines of one kind differ in CPU: an AMD EPYC with AVX512_BF16 multiplies bf16 natively, an
Intel Xeon with AVX-512 but neither AVX512_BF16 nor AMX emulates it, and there a bf16 matmul is
~4x slower than an fp32 one. So "auto" picks bf16 only where it is native.

bf16 counts as native when the CPU has avx512_bf16 or amx_bf16 *and* oneDNN is allowed to use
them: ``ONEDNN_MAX_CPU_ISA=AVX512_CORE`` (or AVX2, ...) on a bf16 machine caps oneDNN below them,
so the machine behaves, and resolves "auto", like one without native bf16 (how to reproduce the
Intel case on an AMD machine). Flags come from /proc/cpuinfo (Linux x86; elsewhere no flags are
known and "auto" means float32). A leaf module: stdlib and torch only.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

CPUINFO = Path("/proc/cpuinfo")

ONEDNN_ISA_MASKS: dict[str, int] = {
    "SSE41": 0x1,
    "AVX": 0x3,
    "AVX2": 0x7,
    "AVX2_VNNI": 0xF,
    "AVX2_VNNI_2": 0x1F,
    "AVX512_CORE": 0x27,
    "AVX512_CORE_VNNI": 0x67,
    "AVX512_CORE_BF16": 0xE7,
    "AVX512_CORE_FP16": 0x1EF,  # = AVX10_1_512
    "AVX512_CORE_AMX": 0xFEF,  # = AVX10_1_512_AMX
    "AVX512_CORE_AMX_FP16": 0x1FEF,
}
"""ONEDNN_MAX_CPU_ISA values and their dnnl_cpu_isa_t bit masks (oneDNN 3.x, dnnl_types.h): a cap
lets oneDNN use level L iff mask(L) is a subset of mask(cap). DEFAULT / ALL mean no cap."""

ONEDNN_ISA_NEEDS: dict[str, tuple[str, ...]] = {
    "SSE41": ("sse4_1",),
    "AVX": ("avx",),
    "AVX2": ("avx2", "fma"),
    "AVX2_VNNI": ("avx2", "fma", "avx_vnni"),
    "AVX512_CORE": ("avx512f", "avx512bw", "avx512vl", "avx512dq"),
    "AVX512_CORE_VNNI": ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"),
    "AVX512_CORE_BF16": ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16"),
    "AVX512_CORE_FP16": ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16",
                         "avx512_fp16"),
    "AVX512_CORE_AMX": ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16",
                        "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16"),
}
"""The /proc/cpuinfo flags each oneDNN level needs (cumulative, as oneDNN's levels are)."""


@dataclass(frozen=True)
class CpuFacts:
    """This CPU and what the libraries torch calls into may use on it."""

    vendor: str
    """/proc/cpuinfo vendor_id: "GenuineIntel", "AuthenticAMD"; "" where unknown."""
    model_name: str
    """/proc/cpuinfo model name, e.g. "AMD EPYC 9R14 96-Core Processor"; "" where unknown."""
    avx2: bool
    avx512f: bool
    avx512_core: bool
    """avx512bw + avx512vl + avx512dq (with avx512f): oneDNN's AVX512_CORE, ATen's avx512."""
    avx512_vnni: bool
    avx512_bf16: bool
    """Native bf16 dot products (vdpbf16ps): AMD Zen 4+, Intel Cooper Lake / Sapphire Rapids+."""
    amx_bf16: bool
    amx_tile: bool
    onednn_max_cpu_isa: str | None
    """The ONEDNN_MAX_CPU_ISA environment cap, upper-cased, if set."""
    aten_cpu_capability_env: str | None
    """The ATEN_CPU_CAPABILITY environment cap, if set."""
    aten_capability: str
    """The kernels ATen dispatches to: torch.backends.cpu.get_cpu_capability() ("AVX512", ...)."""
    onednn_levels: tuple[str, ...]
    """ONEDNN_MAX_CPU_ISA values this CPU's flags support, lowest first (before any cap)."""
    aten_levels: tuple[str, ...]
    """ATEN_CPU_CAPABILITY values this CPU's flags support: "default", "avx2", "avx512"."""
    threads: int
    """torch.get_num_threads() when the facts were read."""
    native_bf16: bool
    """bf16 matmuls run on bf16 hardware: avx512_bf16 or amx_bf16, not excluded by the cap."""
    bf16_reason: str
    """Why native_bf16 is what it is, in words (printed next to a resolved "auto")."""

    @property
    def cpu(self) -> str:
        return self.model_name or self.vendor or "unknown CPU"

    def record(self) -> dict[str, str | bool | None]:
        """The facts a run records next to its dtypes (summary.json's "cpu")."""
        return {
            "vendor": self.vendor,
            "model_name": self.model_name,
            "native_bf16": self.native_bf16,
            "bf16_reason": self.bf16_reason,
            "aten_capability": self.aten_capability,
            "onednn_max_cpu_isa": self.onednn_max_cpu_isa,
        }


def parse_cpuinfo(text: str) -> tuple[str, str, frozenset[str]]:
    """(vendor, model name, flags) of the first processor in /proc/cpuinfo text."""
    vendor, model, flags = "", "", frozenset()
    for line in text.splitlines():
        if not line.strip():
            if flags:
                break  # end of the first processor's block
            continue
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "vendor_id":
            vendor = value
        elif key == "model name":
            model = value
        elif key in ("flags", "Features"):
            flags = frozenset(value.split())
    return vendor, model, flags


def onednn_levels(flags: frozenset[str]) -> tuple[str, ...]:
    """The ONEDNN_MAX_CPU_ISA levels these flags support, lowest first."""
    return tuple(level for level, needs in ONEDNN_ISA_NEEDS.items() if all(f in flags for f in needs))


def onednn_allows(cap: str | None, level: str) -> bool:
    """Whether an ONEDNN_MAX_CPU_ISA cap lets oneDNN use ``level`` (no cap, DEFAULT, ALL or a
    name oneDNN does not know: yes, as oneDNN itself then applies no cap)."""
    if cap is None or cap not in ONEDNN_ISA_MASKS:
        return True
    need = ONEDNN_ISA_MASKS[level]
    return ONEDNN_ISA_MASKS[cap] & need == need


def read_cpu_facts(cpuinfo: str, env: Mapping[str, str]) -> CpuFacts:
    """CpuFacts from /proc/cpuinfo text and an environment (uncached; cpu_facts() is this
    machine's). ATen's capability and the thread count are always this process's."""
    vendor, model, flags = parse_cpuinfo(cpuinfo)
    cap = env.get("ONEDNN_MAX_CPU_ISA", "").strip().upper() or None
    core = all(f in flags for f in ONEDNN_ISA_NEEDS["AVX512_CORE"])
    native, reason = _native_bf16(flags, cap)
    aten = ("default",) + (("avx2",) if {"avx2", "fma"} <= flags else ()) + (("avx512",) if core else ())
    return CpuFacts(
        vendor=vendor,
        model_name=model,
        avx2="avx2" in flags,
        avx512f="avx512f" in flags,
        avx512_core=core,
        avx512_vnni="avx512_vnni" in flags,
        avx512_bf16="avx512_bf16" in flags,
        amx_bf16="amx_bf16" in flags,
        amx_tile="amx_tile" in flags,
        onednn_max_cpu_isa=cap,
        aten_cpu_capability_env=env.get("ATEN_CPU_CAPABILITY") or None,
        aten_capability=torch.backends.cpu.get_cpu_capability(),
        onednn_levels=onednn_levels(flags),
        aten_levels=aten,
        threads=torch.get_num_threads(),
        native_bf16=native,
        bf16_reason=reason,
    )


def _native_bf16(flags: frozenset[str], cap: str | None) -> tuple[bool, str]:
    units = [(f, level) for f, level in (("avx512_bf16", "AVX512_CORE_BF16"), ("amx_bf16", "AVX512_CORE_AMX"))
             if f in flags]
    if not units:
        return False, "no avx512_bf16/amx_bf16"
    allowed = [f for f, level in units if onednn_allows(cap, level)]
    if not allowed:
        return False, f"ONEDNN_MAX_CPU_ISA={cap} excludes {'/'.join(f for f, _ in units)}"
    return True, "/".join(allowed)


@functools.cache
def cpu_facts() -> CpuFacts:
    """This machine's CpuFacts, read once per process."""
    text = CPUINFO.read_text() if CPUINFO.is_file() else ""
    return read_cpu_facts(text, os.environ)


def native_bf16(device: str = "cpu") -> bool:
    """Whether bf16 compute is native on ``device`` ("cpu", or a CUDA device)."""
    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return cpu_facts().native_bf16


AUTO_DTYPE_ENV = "TIDAL_AUTO_DTYPE"
"""Environment variable that makes "auto" resolve to the dtype it names (float32 | bfloat16)
whatever the hardware: the test suite sets float32, so it checks the same numbers on a CPU with
native bf16 and on one without (bf16 is tested where a test asks for it by name)."""


def resolve_dtype(name: str, device: str = "cpu") -> str:
    """A config's dtype name made concrete: "auto" -> "bfloat16" where bf16 is native on
    ``device``, "float32" elsewhere; any other name is returned as it is."""
    if name != "auto":
        return name
    forced = os.environ.get(AUTO_DTYPE_ENV, "")
    if forced:
        if forced not in ("float32", "bfloat16"):
            raise ValueError(f"{AUTO_DTYPE_ENV}={forced!r}: use float32 or bfloat16 (or unset it)")
        return forced
    return "bfloat16" if native_bf16(device) else "float32"


def explain_dtype(device: str = "cpu") -> str:
    """Why "auto" resolves as it does here, e.g. "no native bf16: Intel(R) Xeon(R) Processor,
    no avx512_bf16/amx_bf16"."""
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(device) if torch.cuda.is_available() else "no CUDA device"
        return f"{'native' if native_bf16(device) else 'no native'} bf16: {name}"
    facts = cpu_facts()
    return f"{'native' if facts.native_bf16 else 'no native'} bf16: {facts.cpu}, {facts.bf16_reason}"


def pin_process(cpus: list[int]) -> None:
    """Pin every thread of this process (and the threads and children it starts later) to
    ``cpus``: the disaggregated layout of a real deployment on one machine, the trainer on some
    cores and the rollout workers on others. os.sched_setaffinity(0) moves only the calling
    thread on Linux, so each thread of /proc/self/task is moved. A CPU this machine does not
    have is an error naming it."""
    if not cpus:
        return
    have = os.sched_getaffinity(0) | set(range(os.cpu_count() or 1))
    missing = sorted(set(cpus) - have)
    if missing:
        raise ValueError(f"cannot pin to CPUs {missing}: this machine has CPUs {sorted(have)} "
                         "(check run.trainer_cpus / run.worker_cpus)")
    tids = [int(t) for t in os.listdir("/proc/self/task")] if os.path.isdir("/proc/self/task") else [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, set(cpus))
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile
            pass
