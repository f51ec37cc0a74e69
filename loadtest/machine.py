"""What machine a figure was measured on: written into every result JSON of ``loadtest/`` and
``bench/``.

Machines of one kind differ: some of these VMs have AVX-512 and VNNI, others AVX2 only, and
ONNX Runtime's and CTranslate2's kernels follow the flags. A figure without them cannot be
compared with another.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

CPUINFO = Path("/proc/cpuinfo")
# The flags that pick the kernels: AVX / AVX2 / AVX-512 (and its VNNI, BF16, ...), FMA, AMX.
SIMD_PREFIXES = ("avx", "fma", "amx")


def simd_flags(cpuinfo: str) -> list[str]:
    """The SIMD flags of the first processor listed in a ``/proc/cpuinfo`` text, sorted."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return sorted({f for f in line.split(":", 1)[1].split() if f.startswith(SIMD_PREFIXES)})
    return []


def cpu_model(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine_facts() -> dict[str, Any]:
    """CPU model, logical CPUs this process may use, SIMD flags, Python, OS, and the load
    average when it is called (results write it at the end of a run)."""
    try:
        cpuinfo = CPUINFO.read_text()
    except OSError:
        cpuinfo = ""
    usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return {
        "cpu": cpu_model(cpuinfo),
        "logical_cpus": len(usable) if usable else os.cpu_count(),
        "simd": simd_flags(cpuinfo),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "gpus": gpu_facts(),
    }


def gpu_facts() -> list[dict[str, str]]:
    """Name, driver and memory of every NVIDIA GPU ``nvidia-smi`` sees; empty without one."""
    fields = ("name", "driver_version", "memory.total")
    try:
        completed = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if completed.returncode != 0:
        return []
    return [
        dict(zip(fields, (part.strip() for part in line.split(",")), strict=False))
        for line in completed.stdout.splitlines()
        if line.strip()
    ]
