"""docs/study-settings.md against full_matrix: each listed setting's full_matrix value is what a cell
of that kind resolves to, and every value that differs from the study's gives its reason."""
import pytest
import yaml

from grid.expand import expand
from grid.launch import compose
from tests.conftest import REPO

TABLE = REPO / "docs" / "study-settings.md"


def knob_rows():
    """(setting, cells, study, full_matrix, why) of the first table."""
    text = TABLE.read_text()
    section = text.split("## Settings with a harness knob", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) == 6 and cols[0].startswith("`"):
            rows.append((cols[0].strip("`"), cols[1], cols[2], cols[4], cols[5]))
    return rows


@pytest.fixture(scope="module")
def resolved():
    cfg = compose(["sweep=full_matrix"])
    cells = expand(cfg.sweep, cfg.cluster, "runs")
    for cell in cells:  # the data files need not exist to read the settings
        cell.overrides.setdefault("data", {})
    return cells


def cell_for(cells, scope: str):
    words = scope.split()
    for cell in cells:
        task, topology = cell.axes["task"], cell.axes["topology"]
        if scope == "all" and topology == "voting" or (words and words[0] == task and topology == words[-1]):
            return cell
    raise AssertionError(f"no full_matrix cell for '{scope}'")


def value_of(cell, dotted: str):
    from harness.config import CellConfig
    from omegaconf import OmegaConf

    config = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(CellConfig), cell.overrides))
    for part in dotted.split("."):
        config = config[part]
    return config


def parsed(text: str):
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def test_the_table_lists_the_studys_optimizer_loss_sampling_grouping_and_data():
    names = {row[0] for row in knob_rows()}
    for wanted in ("algo.temperature", "algo.adv_grouping", "algo.weight_decay", "algo.adam_betas", "algo.adam_eps",
                   "algo.max_grad_norm", "algo.loss_agg", "task", "data.split"):
        assert wanted in names, wanted
    assert len(knob_rows()) >= 40


@pytest.mark.parametrize("row", knob_rows(), ids=lambda r: f"{r[0]}@{r[1]}")
def test_each_listed_full_matrix_value_is_what_the_cells_resolve_to(resolved, row):
    setting, scope, study, listed, why = row
    got = value_of(cell_for(resolved, scope), setting)
    want = parsed(listed)
    if isinstance(want, float) or isinstance(got, float):
        assert got == pytest.approx(float(want)), (setting, scope, got, listed)
    else:
        assert got == want, f"{setting} ({scope}): full_matrix gives {got!r}, the table says {listed}"
    if parsed(study) != want:  # a difference says why, not "same"
        assert why and not why.startswith("same"), (setting, why)


@pytest.mark.parametrize("scope,key,upstream", [
    ("math eval_opt", "workflow.max_iterations", 3),   # dashboard/task_configs.py l.44-47, launch_experiment.sh l.139-140
    ("code eval_opt", "workflow.max_iterations", 2),   # dashboard/task_configs.py l.110, launch_experiment.sh l.151-152
    ("math orch_workers", "workflow.max_subtasks", 3),  # dashboard/task_configs.py l.52-55, launch_experiment.sh l.145-146
    ("code orch_workers", "workflow.max_subtasks", 3),  # dashboard/task_configs.py l.120
    ("all", "ckpt_every", 5),                            # study.yaml l.152 (trainer.save_freq)
])
def test_full_matrix_runs_the_sizes_the_studys_launcher_passes(resolved, scope, key, upstream):
    assert value_of(cell_for(resolved, scope), key) == upstream


def test_under_the_studys_cluster_the_token_budget_is_the_study_launchers_for_its_gpus():
    """dashboard/launch_experiment.sh:191-202 sets ppo_max_token_len_per_gpu per GPU type and size;
    cluster=study runs 0.6B and 1.7B on L40S and 4B on H100, and resolves that table."""
    cfg = compose(["sweep=full_matrix", "cluster=study"])
    budgets = {}
    for cell in expand(cfg.sweep, cfg.cluster, "runs"):
        cell.overrides.setdefault("data", {})
        budgets.setdefault(cell.axes["scale"], set()).add(value_of(cell, "verl.max_token_len_per_gpu"))
    assert budgets == {"qwen3-0.6b": {28672}, "qwen3-1.7b": {23554}, "qwen3-4b": {40960}}


def test_full_matrix_dry_run_shows_the_studys_loops_validation_and_checkpoints():
    """What a reader checks against the paper before spending GPU-hours, in the dry run itself: Eval-Opt's
    3 / 2 drafts (dashboard/task_configs.py l.44-47, l.110), 3 subtasks (l.52-55, l.120), validation every
    10 steps on AIME 2025 and DeepCoder's held-out 1,000 (study.yaml test_freq; prepare_deepcoder_data.py),
    a checkpoint every 5 steps, all kept (study.yaml l.152), and how the paper's math figures are scored."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "grid/launch.py", "sweep=full_matrix", "dry_run=true"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert "loops: eval_opt: 2 drafts at most, each judged on deepcoder; 3 drafts at most, each judged on dapo-math" \
        in out
    assert "loops: orch_workers: 3 subtasks at most on dapo-math, deepcoder" in out
    assert "validation: dapo-math: every 10 steps, 30 problems x 1 on aime_2025.parquet" in out
    assert ("validation: deepcoder: every 10 steps, 1000 problems x 1 on the training file's held-out part "
            "(test_size 1000 problems, seed 42)") in out
    assert "training: 500 steps, a checkpoint every 5 (100 kept)" in out
    assert "action=evaluate evaluate.split=held_out evaluate.problems=null evaluate.lengths=study" in out
    assert out.strip().splitlines()[-1].startswith("42 cells")  # the summary stays the last line
