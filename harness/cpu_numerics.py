"""One set of floats on any x86-64 CPU: the tiny model's training is tuned against exact numbers (a learning
check, an alert's step), and PyTorch's CPU kernels pick their instructions by machine (AVX2, AVX-512, AMX),
which changes float reductions and, over 100 steps, the run. Pinning ATen's kernels and MKL to their AVX2
paths (MKL's conditional numerical reproducibility) gives every AVX2 machine the same numbers. The pin is
read when torch starts, so it must be set before torch is imported (tests/conftest.py does; a user can
export the same variables for any run)."""
from __future__ import annotations

import os
import platform
import sys
from typing import Dict

PINS: Dict[str, str] = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def _cpuinfo() -> str:
    """/proc/cpuinfo's text ("" where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


def _has_avx2() -> bool:
    return " avx2" in _cpuinfo()


def pin() -> Dict[str, str]:
    """Set the pins (where unset) before torch loads; returns what was pinned ({} off x86-64 or without AVX2)."""
    if "torch" in sys.modules:
        raise RuntimeError("cpu_numerics.pin() must run before torch is imported: torch reads the pins once")
    if platform.machine() not in ("x86_64", "AMD64") or not _has_avx2():
        return {}
    for name, value in PINS.items():
        os.environ.setdefault(name, value)
    return {name: os.environ[name] for name in PINS}


def cpu_vendor() -> str:
    """GenuineIntel, AuthenticAMD, ... ("" where /proc/cpuinfo does not say)."""
    return next((line.split(":", 1)[1].strip() for line in _cpuinfo().splitlines() if line.startswith("vendor_id")), "")


def fingerprint() -> Dict[str, str]:
    """What decides the CPU floats of this process: part of any cache key that names one set of weights.
    MKL takes its reproducible AVX2 branch on Intel CPUs only (elsewhere only MKL_CBWR=COMPATIBLE is
    reproducible): under the pins an AMD CPU computes other floats than an Intel one, so the vendor is
    part of it (measured: the warm tiny-m's greedy accuracy 0.461 on an AMD EPYC, 0.48 on Intel)."""
    import torch

    mkl_cbwr = os.environ.get("MKL_CBWR", "")
    vendor = {} if mkl_cbwr.startswith("COMPATIBLE") else {"vendor": cpu_vendor()}
    return {"capability": torch.backends.cpu.get_cpu_capability(), "mkl_cbwr": mkl_cbwr, **vendor}
