"""The warm tiny model: one cache key names one set of weights, whichever process builds it first (a
launcher warming models for its cells, a test, a cell itself), whatever its thread count."""
import subprocess
import sys

from tests.conftest import REPO

BUILD = """
import sys, torch
torch.set_num_threads(int(sys.argv[1]))
from harness.tasks import build_task
from harness.validation import load_config
from harness.warmup import prepare_model
cfg = load_config(["root=unused", "model.warmup_steps=30", f"model.cache_dir={sys.argv[2]}"])
print(prepare_model(cfg, build_task(cfg), log=lambda *a: None))
"""


def test_the_warm_model_is_the_same_whatever_the_builders_thread_count(tmp_path):
    built = []
    for threads in (1, 2):
        proc = subprocess.run([sys.executable, "-c", BUILD, str(threads), str(tmp_path / f"cache{threads}")], cwd=REPO,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        built.append(proc.stdout.strip().splitlines()[-1])
    assert built[0].rsplit("/", 1)[-1] == built[1].rsplit("/", 1)[-1]  # the same key
    weights = [next((tmp_path / f"cache{t}").glob("*/model.safetensors")).read_bytes() for t in (1, 2)]
    assert weights[0] == weights[1]
