"""The tests' CPU floats are pinned to AVX2 kernels (tests/conftest.py), and the warm model's cache key names
the kernels that trained it: on a machine with AVX-512, an unpinned process gets other weights under another key."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness import cpu_numerics
from tests.conftest import REPO

KEY = ("from harness.config import CellConfig; from harness.tasks import build_task; "
       "from harness.warmup import warm_key; import torch; c = CellConfig(); "
       "print(torch.backends.cpu.get_cpu_capability(), warm_key(c, build_task(c)))")


def _key(**env: str) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k not in cpu_numerics.PINS}
    out = subprocess.run([sys.executable, "-c", KEY], cwd=REPO, env={**base, **env}, capture_output=True, text=True,
                         check=True)
    return out.stdout.split()


@pytest.mark.skipif(not cpu_numerics._has_avx2(), reason="an x86-64 CPU without AVX2: nothing is pinned")
def test_the_pin_reaches_torch_and_the_warm_key_names_the_kernels():
    import torch

    assert torch.backends.cpu.get_cpu_capability() == "AVX2" and os.environ["MKL_CBWR"] == "AVX2,STRICT"
    pinned = _key(**cpu_numerics.PINS)
    baseline = _key(ATEN_CPU_CAPABILITY="default")  # the kernels every x86-64 CPU has: never AVX2's
    assert pinned[0] == "AVX2" and baseline[0] == "DEFAULT" and pinned[1] != baseline[1]
    assert _key(**cpu_numerics.PINS) == pinned  # the key is a function of the kernels, not of the process


def test_pinning_after_torch_is_loaded_is_refused():
    out = subprocess.run([sys.executable, "-c", "import torch; from harness import cpu_numerics; cpu_numerics.pin()"],
                         cwd=REPO, capture_output=True, text=True)
    assert out.returncode != 0 and "before torch is imported" in out.stderr


def test_the_fingerprint_names_the_cpu_vendor_where_mkl_branches_on_it():
    """MKL's reproducible AVX2 branch is Intel's only: the same pins give an AMD CPU other floats."""
    code = "from harness import cpu_numerics; print(cpu_numerics.fingerprint().get('vendor'))"
    with open("/proc/cpuinfo") as f:
        vendor = next(line.split(":", 1)[1].strip() for line in f if line.startswith("vendor_id"))
    pinned = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    compatible = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                                env={**os.environ, "MKL_CBWR": "COMPATIBLE"})
    assert pinned.stdout.strip() == vendor and compatible.stdout.strip() == "None"
