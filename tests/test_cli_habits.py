"""Hydra habits on both command lines, the launcher's typed options, YAML errors with their place,
and `action=status` on the sweep as it was launched. Each answer is one `error:` line, exit 2,
nothing written."""
import json

import pytest

from grid.launch import EXIT_BAD_INPUT, LAUNCH_RECORD
from grid.launch import main as launch_main
from harness.run import main as run_main


@pytest.mark.parametrize("argv,message", [
    (["+stepz=10"], "+stepz: the config has no key 'stepz'; did you mean steps"),
    (["+algo.lrr=1e-3"], "the config has no key 'lrr' under algo; did you mean algo.lr?"),
    (["seed=0,1"], "seed=0,1: one cell runs here; to run several values use the grid launcher"),
    (["seed=range(0,3)"], "one cell runs here"),
    (["-m", "seed=1"], "-m: one cell runs here"),
    (["--multirun"], "--multirun: one cell runs here"),
    (["--steps", "10"], "--steps: options are key=value, e.g. steps=10"),
    (["--steps=10"], "options are key=value, e.g. steps=10"),
    (["--cfg", "hydra"], "only '--cfg job' is supported here"),
])
def test_a_cell_command_line_habit_gets_one_line_saying_what_to_write(tmp_path, capsys, argv, message):
    assert run_main([f"root={tmp_path}", *argv]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert not any(tmp_path.iterdir())


def test_a_new_key_under_a_free_form_dict_is_kept(tmp_path):
    from tests.conftest import cell

    cfg = cell(tmp_path, "topology=voting", "+reward.per_role.aggregator.length=-0.5",
               "workflow.role_max_new_tokens.aggregator=24")  # without `+`: the dict's key, kept as well
    assert cfg.reward.per_role["aggregator"]["length"] == -0.5
    assert cfg.workflow.role_max_new_tokens == {"aggregator": 24}


def test_cfg_job_prints_the_resolved_cell_config_and_runs_nothing(tmp_path, capsys):
    import yaml

    assert run_main(["--cfg", "job", f"root={tmp_path}", "topology=voting", "steps=7"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["topology"] == "voting" and printed["steps"] == 7
    assert printed["cell_id"] == "voting-ip-arith-tiny-m-s0"  # resolved: the default id is filled in
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("argv,message", [
    (["dry_run=ture"], "dry_run: Value 'ture' is not a valid bool"),
    (["dryrun=true"], "unknown launch option 'dryrun'; did you mean dry_run?"),
    (["wait=maybe"], "wait: Value 'maybe' is not a valid bool"),
    (["-m"], "-m: the launcher expands lists, not Hydra's sweeps"),
    (["sweep.axes.seed=0,1"], "write the values as a list, e.g. 'sweep.axes.seed=[0,1]'"),
    (["--dry-run"], "options are key=value, e.g. dry_run=<value>"),
])
def test_a_launcher_habit_gets_one_line_and_submits_nothing(tmp_path, capsys, argv, message):
    root = tmp_path / "runs"
    assert launch_main([f"root={root}", "sweep=smoke", *argv]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert not root.exists()


def test_a_dry_run_with_invalid_cells_lists_them_and_exits_2(tmp_path, capsys):
    root = tmp_path / "runs"
    assert launch_main([f"root={root}", "sweep=smoke", "sweep.cell.steps=-1", "dry_run=true"]) == EXIT_BAD_INPUT
    out, err = capsys.readouterr()
    assert out.count("steps must be >= 1, got -1") == 7  # every cell's check column says why
    assert err.strip() == "error: 7 of 7 cells are invalid (their check column says why)"
    assert not root.exists()


def test_status_shows_the_sweep_as_it_was_launched(tmp_path, capsys):
    root = tmp_path / "runs"
    sweep_dir = root / "smoke"
    sweep_dir.mkdir(parents=True)
    launched = [f"root={root}", "sweep=smoke", "sweep.cell.steps=10", "sweep.axes.topology=[voting]"]
    (sweep_dir / LAUNCH_RECORD).write_text(json.dumps({"launches": [{"overrides": launched, "at": "then"}]}))
    assert launch_main([f"root={root}", "sweep=smoke", "action=status"]) == 0
    out = capsys.readouterr().out
    assert "status of the sweep as launched at then: " + " ".join(launched) in out
    rows = [line.split() for line in out.splitlines() if line.startswith(("voting-", "single-", "eval_opt-"))]
    assert {row[0] for row in rows} == {"voting-sp-arith-tiny-m-s0", "voting-ip-arith-tiny-m-s0", "single-arith-tiny-m-s0"}
    assert all(row[2] == "0/10" for row in rows)  # not the sweep file's 20 steps
    # an override given now wins over the stored one
    assert launch_main([f"root={root}", "sweep=smoke", "action=status", "sweep.cell.steps=12"]) == 0
    assert all(line.split()[2] == "0/12" for line in capsys.readouterr().out.splitlines() if line.startswith("voting-"))


def test_a_launch_records_its_overrides_beside_the_cells(tmp_path):
    from grid.launch import record_launch

    record_launch(tmp_path, ["sweep=smoke", "sweep.cell.steps=10", "dry_run=false", "wait=true"])
    record_launch(tmp_path, ["sweep=smoke"])
    launches = json.loads((tmp_path / LAUNCH_RECORD).read_text())["launches"]
    assert [l["overrides"] for l in launches] == [["sweep=smoke", "sweep.cell.steps=10"], ["sweep=smoke"]]


def test_a_graph_yaml_error_names_its_line_and_column(tmp_path, capsys):
    graph = tmp_path / "graph.yaml"
    graph.write_text("name: g\nroles:\n  solver: {contract: answer}\nnodes: [a, b\n")
    assert run_main([f"root={tmp_path / 'runs'}", f"topology={graph}"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"{graph}:5:1: expected ',' or ']'" in err, err


def test_make_demo_installs_only_what_the_smoke_sweep_needs():
    """make demo once ran apt-get (the jail) and npm (the Qwen3 tokenizer) before a sweep that needs
    neither: no smoke cell runs model-written code or a model over Qwen3's tokenizer."""
    import re
    from pathlib import Path

    import yaml

    from harness.tasks import CODE_TASKS
    from harness.models import SCALES, RandomQwen3

    repo = Path(__file__).resolve().parents[1]
    demo = re.search(r"^demo:(.*)$", (repo / "Makefile").read_text(), flags=re.M).group(1).split()
    assert "jail" not in demo and "qwen3-tokenizer" not in demo and "setup" not in demo
    smoke = yaml.safe_load((repo / "grid" / "conf" / "sweep" / "smoke.yaml").read_text())["axes"]
    assert all(s.startswith("tiny") for s in smoke["scale"])
    tasks = {yaml.safe_load((repo / "grid" / "conf" / "task" / f"{axis}.yaml").read_text())["tiny"] for axis in smoke["task"]}
    assert tasks == {"arith"} and not tasks & set(CODE_TASKS), "a code task in the smoke sweep needs the jail: add jail to demo"
    assert not any(isinstance(SCALES[s], RandomQwen3) for s in smoke["scale"]), "a Qwen3-tokenizer scale: add qwen3-tokenizer"


def test_a_free_form_setting_takes_a_whole_dict_without_plus(tmp_path):
    """`algo.kl_coef_per_role={voter: 0.1}` once failed "Key 'voter' is not in struct" and asked for `+`:
    a setting that is a free-form dict takes new names like any other value."""
    from harness.validation import load_config

    cfg = load_config(["algo.kl_coef_per_role={voter:0.1}", "algo.coherence_damping.voter=0.3", f"root={tmp_path}"])
    assert cfg.algo.kl_coef_per_role == {"voter": 0.1} and cfg.algo.coherence_damping == {"voter": 0.3}


def test_help_lists_sections_and_each_section_its_keys(capsys):
    """--help was a 240-line dump; now the settings and one line per section, and --help <section>."""
    assert run_main(["--help"]) == 0
    text = capsys.readouterr().out
    assert len(text.splitlines()) <= 60 and "--help <section>" in text
    for section in ("workflow", "algo", "reward", "monitors", "data"):
        assert any(line.strip().startswith(section + " ") for line in text.splitlines()), section
    assert run_main(["--help", "algo"]) == 0
    algo = capsys.readouterr().out
    assert algo.startswith("algo:\n") and "  lr: " in algo and "coherence_damping" in algo
    assert run_main(["--help", "algoo"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("error: no section 'algoo'; valid: ") and err.count("\n") == 1


def test_the_launcher_prints_the_resolved_sweep_with_cfg_job(tmp_path, capsys):
    import yaml

    assert launch_main(["--cfg", "job", "sweep=smoke", f"root={tmp_path}", "sweep.cell.steps=3"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["sweep"]["name"] == "smoke" and printed["sweep"]["cell"]["steps"] == 3
    assert printed["launcher"]["name"] == "local" and not any(tmp_path.iterdir())


def test_a_local_sweep_shows_the_warm_up_before_its_cells_start(tmp_path, capsys):
    """make demo was silent for the warm-up's two minutes (each cell warmed the model in its own log):
    the local launcher warms each model once, printing its progress, then the cells find it cached."""
    cache, root = tmp_path / "cache", tmp_path / "runs"
    one = [f"root={root}", "sweep=smoke", "sweep.axes.topology=[voting]", "sweep.axes.sharing=[ip]",
           "sweep.baseline=false", "sweep.cell.steps=1", "sweep.cell.val_problems=2", "sweep.cell.report=false",
           f"sweep.cell.model.cache_dir={cache}", "sweep.cell.model.warmup_steps=3"]
    assert launch_main(one) == 0
    out = capsys.readouterr().out
    assert "[models] warming up tiny-m on task arith" in out and "[warmup] done in" in out
    assert out.index("[warmup] done in") < out.index("started voting-ip-arith-tiny-m-s0")
    log = next((root / "smoke" / ".submitit").glob("*_0_log.out")).read_text()
    assert "[models] warming up" not in log  # the cell found it cached
