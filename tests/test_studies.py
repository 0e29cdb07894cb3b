"""Studies as files (analysis/studies.py): every figure a doc quotes regenerates from the committed
outcomes, and no seed a study used to decide something is scored as held out."""
import subprocess
import sys

import pytest

from analysis.studies import (BLOCK, StudyError, decision_seeds, fill_blocks, load_studies, refuse_decision_seeds,
                              seed_list, seed_ranges)
from tests.conftest import REPO


def test_the_committed_figures_are_what_the_committed_outcomes_give():
    """README, docs, results.md and calibration.json against a fresh render (the CLI's --check)."""
    proc = subprocess.run([sys.executable, "-m", "analysis.studies", "render", "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_quoted_block_names_a_study_that_renders_it():
    names = {s.name for s in load_studies()}
    quoted = [(path.name, m.group("name")) for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
              for m in BLOCK.finditer(path.read_text())]
    assert quoted and all(name in names for _, name in quoted), quoted


def test_a_stale_block_is_found_and_an_unknown_one_is_an_error():
    figures = {"s": {"table": "| a |\n| 1 |"}}
    stale = "text\n<!-- study:s:table -->\n| a |\n| 0 |\n<!-- /study -->\nmore\n"
    assert fill_blocks(stale, figures, "page") == "text\n<!-- study:s:table -->\n| a |\n| 1 |\n<!-- /study -->\nmore\n"
    with pytest.raises(StudyError, match="page: quotes study 's' block 'other', which no study renders"):
        fill_blocks("<!-- study:s:other -->\n<!-- /study -->\n", figures, "page")


def test_seed_lists_and_ranges_round_trip():
    assert seed_list("100-102, 110") == [100, 101, 102, 110] and seed_list([1, "3-4"]) == [1, 3, 4]
    assert seed_ranges([202, 200, 201, 205]) == "200-202, 205" and seed_list(seed_ranges(range(500, 520))) == list(range(500, 520))


def test_a_seed_that_decided_something_is_never_held_out():
    used = decision_seeds()
    assert used[120].startswith("study ") and "repro_intervene" in used[205]  # a design seed; a spent range
    with pytest.raises(ValueError, match="seed 205 cannot be scored as held out"):
        refuse_decision_seeds({205, 510})
    refuse_decision_seeds(set(range(500, 520)) | set(range(600, 620)))  # the held-out seeds are clean


def test_a_study_that_names_its_folder_wrongly_is_refused(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "study.yaml").write_text("name: yours\nkind: diagnosis\n")
    with pytest.raises(StudyError, match="name 'yours' is not its folder's name 'mine'"):
        load_studies(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "analysis.studies", "collect", "nosuch"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: unknown study 'nosuch'; valid: ")


def test_a_base_cell_of_a_seed_the_study_does_not_list_is_refused(tmp_path):
    """A killed launcher can leave cells of seeds a study dropped beside its own: collecting them would
    score seeds the preregistration never named."""
    from omegaconf import OmegaConf

    from analysis.studies import collect
    from harness.config import CellConfig

    (tmp_path / "studies" / "s").mkdir(parents=True)
    (tmp_path / "studies" / "s" / "study.yaml").write_text(
        "name: s\nkind: interventions\nheld_out: {seeds: '1-2'}\nruns: {base: sw, arms: sw-interventions}\n")
    cell = OmegaConf.structured(CellConfig)
    cell.topology, cell.seed, cell.extra = "voting", 5, {"action": "alert"}
    run = tmp_path / "runs" / "sw" / "voting-ip-arith-tiny-m-s5-action=alert"
    run.mkdir(parents=True)
    (run / "cell.yaml").write_text(OmegaConf.to_yaml(cell))
    (run / "metrics.jsonl").write_text("")
    (tmp_path / "runs" / "sw-interventions").mkdir()
    with pytest.raises(StudyError, match=r"holds cells of seeds \[5\] its seeds do not list"):
        collect("s", tmp_path / "runs", root=tmp_path / "studies")
