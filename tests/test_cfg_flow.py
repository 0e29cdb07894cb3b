"""bench/cfg_flow.py reads how the config travels from the source: a made-up package in which a lower module
reaches a higher one through an import inside a function shows that call as climbing back up, and a call
down as staying."""
import subprocess
import sys

from tests.conftest import REPO


def test_a_call_through_an_import_inside_a_function_climbs_back_up(tmp_path):
    harness = tmp_path / "harness"
    harness.mkdir()
    (harness / "__init__.py").write_text("")
    (harness / "config.py").write_text("def check(cfg):\n    return cfg\n")
    (harness / "engine.py").write_text("from harness.config import check\n\n\ndef build(cfg):\n"
                                       "    from harness.run import setup\n    return setup(cfg)\n")
    (harness / "run.py").write_text("from harness.config import check\nfrom harness.engine import build\n\n\n"
                                    "def run_cell(cfg):\n    check(cfg.algo)\n    return build(cfg)\n\n\n"
                                    "def setup(cfg):\n    return check(cfg)\n")
    out = subprocess.run([sys.executable, str(REPO / "bench" / "cfg_flow.py"), "--root", str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[0] == "4 calls hand on the config: 3 stay, 1 climb back up"
    assert "up: harness.engine.build (layer 1) -> harness.run.setup (layer 2)" in out
    assert "entered most: harness.config 2, harness.run 1, harness.engine 1" in out
