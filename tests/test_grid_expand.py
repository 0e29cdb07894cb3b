"""Sweep expansion, dry runs and bad input for the grid launcher (no cluster needed)."""
import json
import subprocess
import sys
import textwrap

import pytest
from omegaconf import OmegaConf

from grid.expand import GridError, check_cells, expand
from grid.launch import EXIT_BAD_INPUT, compose, main
from tests.conftest import REPO, dry_run_cells

LAUNCH = [sys.executable, "grid/launch.py"]


def test_full_matrix_is_the_seed_study_design():
    cfg = compose(["sweep=full_matrix", "sweep.axes.seed=[0,1]"])
    cells = expand(cfg.sweep, cfg.cluster, "runs")
    assert len(cells) == 84
    multi = [c for c in cells if not c.is_baseline]
    baselines = {c.cell_id: c for c in cells if c.is_baseline}
    assert len(multi) == 72 and len(baselines) == 12
    for c in multi:  # every multi-agent cell is paired with the baseline of its (scale, task, seed)
        b = baselines[c.baseline_id]
        assert (b.axes["scale"], b.axes["task"], b.axes["seed"]) == (c.axes["scale"], c.axes["task"], c.axes["seed"])
    cell = next(c for c in multi if c.cell_id == "voting-ip-deepcoder-qwen3-1.7b-s1")
    # the study's data: DeepCoder split as the study split it, validated on its 1000 held-out problems
    assert cell.overrides["task"] == "deepcoder" and cell.overrides["val_problems"] == 1000
    assert cell.overrides["data"]["split"] == "hf" and cell.overrides["data"]["test_size"] == 1000
    math_cell = next(c for c in multi if c.cell_id == "voting-ip-dapo-math-qwen3-1.7b-s1")
    assert (math_cell.overrides["task"], math_cell.overrides["data"]["val_task"]) == ("dapo-math", "aime")
    assert math_cell.overrides["data"]["path"].endswith("dapo_math_17k_processed_en.parquet")
    assert cell.overrides["model"]["lora_rank"] == 64
    assert cell.overrides["steps"] == 500 and cell.overrides["algo"]["kl_coef"] == 0.0
    algo = cell.overrides["algo"]  # the study's update: 64 x 8 rollouts, mini-batches of 64 problems, clip 0.2/0.28
    assert (algo["problems_per_step"], algo["group_size"], algo["ppo_mini_batch_size"]) == (64, 8, 64)
    assert (algo["clip_ratio_low"], algo["clip_ratio_high"], algo["lr"], algo["lr_schedule"]) == (0.2, 0.28, 2e-5, "cosine")
    assert algo["temperature"] == 0.7 and algo["loss_agg"] == "seq-mean-token-mean" and algo["lr_warmup_steps"] == 15
    assert (algo["weight_decay"], algo["adam_betas"], algo["adv_grouping"]) == (0.01, [0.9, 0.999], "trajectory")
    offline = expand(compose(["sweep=full_matrix_offline"]).sweep, cfg.cluster, "runs")
    assert {c.overrides["task"] for c in offline} == {"gsm8k", "humaneval"}
    assert {tuple(c.axes.items()) for c in offline} == {tuple(c.axes.items()) for c in cells if c.axes["seed"] == 0}
    assert {c.cell_id.split("-s0")[0].split("-qwen3")[0].rsplit("-", 1)[-1] for c in offline} == {"gsm8k", "humaneval"}
    assert cell.resources.gpus == 2 and cell.resources.mem_gb == 128
    # Qwen3 scales train on engine=verl over all the cell's GPUs, with the task's token budgets
    assert cell.overrides["engine"] == "verl" and cell.overrides["verl"]["gpus_per_policy"] == 2
    assert cell.overrides["verl"]["param_dtype"] == "bf16" and cell.overrides["verl"]["gradient_checkpointing"]
    # the study's responses: code 2048 tokens, math 5120, for every role; vLLM holds prompt + response
    assert cell.overrides["workflow"]["max_new_tokens"] == 2048 and "role_max_new_tokens" not in cell.overrides["workflow"]
    assert cell.overrides["verl"]["rollout_max_model_len"] == 12288
    math_orch = next(c for c in multi if c.cell_id == "orch_workers-sp-dapo-math-qwen3-4b-s0")
    assert math_orch.overrides["workflow"]["max_new_tokens"] == 5120
    assert math_orch.overrides["verl"]["rollout_max_model_len"] == 25600
    assert next(c for c in multi if c.cell_id == "eval_opt-ip-dapo-math-qwen3-4b-s0").overrides["verl"]["rollout_max_model_len"] == 35840
    assert baselines["single-dapo-math-qwen3-4b-s0"].overrides["verl"]["rollout_max_model_len"] == 20480
    assert math_orch.overrides["verl"]["gpus_per_policy"] == 4
    again = expand(compose(["sweep=full_matrix", "sweep.axes.seed=[0,1]"]).sweep, cfg.cluster, "runs")
    assert [c.cell_id for c in again] == [c.cell_id for c in cells]  # stable ids


def test_smoke_maps_math_to_the_tiny_task_and_extra_axes_compose():
    cfg = compose(["sweep=smoke", "+sweep.extra_axes.mitigation={none:{},balanced:{algo:{loss_agg:role-balanced}}}"])
    cells = expand(cfg.sweep, cfg.cluster, "runs")
    assert len(cells) == 13  # (3 topologies x 2 sharing) x 2 mitigations + 1 baseline
    balanced = next(c for c in cells if c.cell_id == "voting-ip-arith-tiny-m-s0-mitigation=balanced")
    assert balanced.overrides["task"] == "arith" and balanced.overrides["algo"]["loss_agg"] == "role-balanced"
    assert balanced.baseline_id == "single-arith-tiny-m-s0"
    assert "engine" not in balanced.overrides and "role_max_new_tokens" not in balanced.overrides.get("workflow", {})


def test_any_cell_key_is_a_sweep_cell_setting_without_a_plus():
    """`sweep.cell.algo.lr=0.01` where the sweep's file sets no algo.lr: set, not 'Key lr is not in struct'."""
    cfg = compose(["sweep=smoke", "sweep.cell.algo.lr=0.01", "sweep.cell.steps=7"])
    cells = expand(cfg.sweep, cfg.cluster, "runs")
    assert all(c.overrides["algo"]["lr"] == 0.01 and c.overrides["steps"] == 7 for c in cells)
    assert all(c.overrides["algo"]["ppo_mini_batch_size"] == 4 for c in cells)  # the file's own algo key is kept


def test_dry_run_prints_42_cells_with_gpu_resources():
    proc = subprocess.run(LAUNCH + ["sweep=full_matrix", "dry_run=true"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert "42 cells: 36 multi-agent + 6 single-agent baselines" in lines[-1]
    # header, 42 cells, the training settings (tests/test_study_settings.py reads them), the measured
    # estimate (or why there is none: no GPU figures kept), summary
    settings = [l for l in lines if l.startswith(("loops:", "validation:", "training:", "the paper's"))]
    assert len(lines) == 45 + len(settings) and ("GPU-hours estimate" in lines[-2] or lines[-2].startswith("estimate:"))
    assert lines[43: 43 + len(settings)] == settings  # right after the cells
    assert any("voting-sp-dapo-math-qwen3-4b-s0" in l and "1n 4g 32c 256G 1440m  96 " in l for l in lines)
    # GPU-hours reserved: each cell's GPUs x its time limit (0.6b 1 x 12 h, 1.7b 2 x 18 h, 4b 4 x 24 h),
    # 14 cells per scale (2 tasks x (6 multi-agent + 1 baseline)), summed in the last line
    per_cell = [float(l.split()[line_gpu_column(lines)]) for l in lines[1:43]]
    assert sum(per_cell) == 14 * (12 + 36 + 96) and "2016 GPU-hours reserved" in lines[-1]


def test_study_profile_puts_every_qwen3_cell_on_2_gpus_of_its_type_with_that_types_token_budget():
    cfg = compose(["sweep=full_matrix", "cluster=study"])
    cells = {c.cell_id: c for c in expand(cfg.sweep, cfg.cluster, "runs")}
    big, small = cells["voting-ip-dapo-math-qwen3-4b-s0"], cells["voting-ip-dapo-math-qwen3-0.6b-s0"]
    assert (big.resources.gpus, big.resources.gpu_type, small.resources.gpus, small.resources.gpu_type) == (2, "h100", 2, "l40s")
    assert big.overrides["verl"]["max_token_len_per_gpu"] == 40960 and small.overrides["verl"]["max_token_len_per_gpu"] == 28672
    assert cells["single-deepcoder-qwen3-1.7b-s0"].overrides["verl"]["max_token_len_per_gpu"] == 23554
    from grid.submit import _slurm_parameters

    launcher = OmegaConf.create({"array_parallelism": 4})
    assert _slurm_parameters(cfg.cluster, launcher, big.resources)["slurm_constraint"] == "h100"
    assert _slurm_parameters(cfg.cluster, launcher, small.resources)["slurm_constraint"] == "l40s"
    proc = subprocess.run(LAUNCH + ["sweep=full_matrix", "cluster=study", "dry_run=true"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert any("voting-ip-dapo-math-qwen3-4b-s0" in l and "1n 2g h100 16c 256G 1440m  48 " in l for l in lines)
    assert "2016 GPU-hours reserved" in lines[-1]  # 42 cells x 2 GPUs x 24 h


def test_a_gpu_type_the_profile_does_not_list_is_one_error():
    proc = subprocess.run(LAUNCH + ["sweep=full_matrix", "cluster=study", "cluster.resources.qwen3-4b.gpu_type=a100",
                                    "dry_run=true"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "gpu_type 'a100'" in proc.stderr and "h100, l40s" in proc.stderr


def line_gpu_column(lines):
    return lines[0].split().index("GPU-h") + 4  # "resources" spans 5 words: 1n 4g 32c 256G 1440m


@pytest.mark.parametrize("overrides,message", [
    (["sweep=everything"], "valid choices: " + ", ".join(sorted(p.stem for p in (REPO / "grid/conf/sweep").glob("*.yaml")))),
    (["sweep=smoke", "cluster=mars"], "valid choices: example_gpu, local, study"),
    (["sweep=smoke", "launcher=pbs"], "valid choices: local, slurm"),
    (["sweep=smoke", "sweep.axes.topology=[star]"], "unknown topology 'star' in the sweep; valid choices: eval_opt"),
    (["sweep=smoke", "sweep.axes.topology=[nowhere/my_flow.yaml,voting]"],
     "unknown topology 'nowhere/my_flow.yaml' in the sweep: no such graph file; valid choices: eval_opt, mask_search, "
     "orch_workers, qd_retrieve_answer, qd_retrieve_evidence_answer, reflective_code, single, voting, "
     "or a path to a workflow graph .yaml file"),
    (["sweep=smoke", "sweep.axes.scale=[huge]"], "unknown scale 'huge'"),
    (["sweep=smoke", "sweep.axes.task=[chess]"], "unknown task 'chess' in the sweep; valid choices: arith, code, math"),
    (["sweep=smoke", "action=restart"], "unknown action 'restart'; valid choices: launch, status"),
    (["sweep=smoke", "action=diagnose", "diagnose.mechanisms=[boredom]"],
     "diagnose.mechanisms: unknown mechanism 'boredom'; valid: unshare_instances, role_count_scaling"),
    (["sweep=smoke", "action=diagnose", "diagnose.resamples=0"], "diagnose.resamples must be >= 1, got 0"),
    (["sweep=smoke", "action=diagnose", "diagnose.resamples=few"], "diagnose.resamples: Value 'few'"),
    (["sweep=smoke", "action=diagnose", "diagnose.rule=vibes"],
     "unknown diagnose.rule 'vibes'; valid choices: failures, failures-or-accuracy"),
    (["sweep=smoke", "action=evaluate", "evaluate.split=nope"], "unknown evaluate.split 'nope'; valid choices: validation, held_out"),
    (["sweep=smoke", "action=evaluate", "evaluate.k=2", "evaluate.samples=1"], "evaluate.samples >= k (got k=2, samples=1"),
    (["sweep=smoke", "steps=3"], "'steps' is a cell setting: write sweep.cell.steps=3"),
    (["sweep=smoke", "sweep.cell.lr=0.01"], "unknown cell key 'lr' in sweep.cell.lr; did you mean algo.lr?"),
    (["sweep=smoke", "sweep.cell.steps=many"], "cell single-arith-tiny-m-s0: bad cell config"),
    (["sweep=smoke", "sweep.axes.seed=[abc]"], "sweep.axes.seed must be non-negative integers, got abc"),
    (["sweep=smoke", "+sweep.cell.algo.lr=nan"], "algo.lr must be a finite number > 0, got nan"),
    (["sweep=smoke", "sweep.axes.scale=[qwen3-0.6b]", "sweep.axes.task=[arith]"], "needs a local checkpoint"),
])
def test_bad_input_submits_nothing(tmp_path, capsys, monkeypatch, overrides, message):
    monkeypatch.delenv("MARL_MODEL_ROOT", raising=False)
    root = tmp_path / "runs"
    assert main([f"root={root}", *overrides]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1, err
    assert not root.exists()


@pytest.mark.parametrize("sweep", ["full_matrix", "smoke"])
def test_direct_config_path_builds_exactly_what_omegaconf_builds(sweep):
    """config_from_dict's fast path (plain typed values) against OmegaConf's merge, cell by cell."""
    from omegaconf import OmegaConf

    from harness.config import CellConfig
    from harness.validation import _build

    cfg = compose([f"sweep={sweep}", "sweep.axes.seed=[0,1]"])
    cells = expand(cfg.sweep, cfg.cluster, "runs")
    for cell in cells:
        slow = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(CellConfig), OmegaConf.create(cell.overrides)))
        assert _build(CellConfig, cell.overrides) == slow, cell.cell_id
    # dicts merge key by key (a prompt override keeps the other prompts), lists are replaced
    merged = _build(CellConfig, {"workflow": {"prompts": {"voter": "v: {question}"}}, "model": {"lora_targets": ["q_proj"]}})
    assert merged.workflow.prompts["voter"] == "v: {question}" and merged.workflow.prompts["solver"] == "solve: {question}"
    assert merged.model.lora_targets == ["q_proj"]


def test_values_off_the_direct_path_are_converted_or_refused_by_omegaconf():
    from harness.config import ConfigError
    from harness.validation import config_from_dict

    assert config_from_dict({"steps": "7", "algo": {"lr": 1}}).steps == 7  # a string for an int: converted
    assert config_from_dict({"algo": {"lr": 1}}).algo.lr == 1.0
    with pytest.raises(ConfigError, match="bad cell config"):
        config_from_dict({"steps": "many"})
    with pytest.raises(ConfigError, match="bad cell config"):
        config_from_dict({"algo": {"learning_rate": 1e-3}})


def test_the_lr_spike_sweep_spikes_only_its_induced_cells_never_a_baseline():
    cfg = compose(["sweep=repro_lr_spike"])
    cells = expand(cfg.sweep, cfg.cluster, "/runs")
    assert len(cells) == 25  # voting x {ip, sp} x {none, lr_spike} x 5 seeds + 5 baselines
    for c in cells:
        spiked = c.axes.get("induced") == "lr_spike"
        algo = c.overrides.get("algo", {})
        assert (algo.get("lr_spike_factor"), algo.get("lr_spike_steps")) == ((5.0, 10) if spiked else (None, None))
        if not c.is_baseline:  # the reference is the unspiked single agent of the same seed
            reference = c.overrides["monitors"]["reference_run"]
            assert reference == f"/runs/repro_lr_spike/single-arith-tiny-m-s{c.axes['seed']}"
    assert sum(c.is_baseline for c in cells) == 5
    check_cells(cells[:2], strict=True)


def test_repro_controls_add_new_seeds_of_repros_default_voting_controls_to_its_directory():
    controls = expand(compose(["sweep=repro_controls"]).sweep, compose(["sweep=repro_controls"]).cluster, "/runs")
    repro = expand(compose(["sweep=repro"]).sweep, compose(["sweep=repro"]).cluster, "/runs")
    assert len(controls) == 15 and not {c.cell_id for c in controls} & {c.cell_id for c in repro}
    arms = {(c.axes["topology"], c.axes["sharing"], c.axes["setting"]) for c in controls if not c.is_baseline}
    assert arms == {("voting", "ip", "default"), ("voting", "sp", "default")}
    assert all(c.overrides["sweep"] == "repro" for c in controls)  # scored with the repro sweep
    for c in controls:
        if not c.is_baseline:
            assert c.overrides["monitors"]["reference_run"] == \
                f"/runs/repro/single-arith-tiny-m-s{c.axes['seed']}-setting=default"
    # the same cells as repro's default-lr Voting controls, at other seeds
    twin = next(c for c in repro if c.cell_id == "voting-ip-arith-tiny-m-s20-mitigation=none-setting=default")
    mine = next(c for c in controls if c.cell_id == "voting-ip-arith-tiny-m-s25-mitigation=none-setting=default")
    strip = lambda o: {k: v for k, v in o.items() if k not in ("seed", "cell_id", "monitors")}
    assert strip(mine.overrides) == strip(twin.overrides)


def test_repro_lists_mitigations_excludes_where_they_cannot_act_and_points_at_the_paired_run():
    cfg = compose(["sweep=repro"])
    cells = expand(cfg.sweep, cfg.cluster, "/runs")
    # voting 6 arms at the fast setting + 2 default-lr controls, eval_opt 3 arms at the default, x 5 seeds,
    # + the baselines of both settings
    assert len(cells) == 65
    arms = sorted({(c.axes["topology"], c.axes["sharing"], c.axes.get("mitigation"), c.axes["setting"])
                   for c in cells if not c.is_baseline})
    assert arms == sorted([("voting", "ip", "none", "fast"), ("voting", "ip", "role_count_scaling", "fast"),
                           ("voting", "ip", "coherence_reg", "fast"), ("voting", "ip_instance", "none", "fast"),
                           ("voting", "sp", "none", "fast"), ("voting", "sp", "role_balanced", "fast"),
                           ("voting", "ip", "none", "default"), ("voting", "sp", "none", "default"),
                           ("eval_opt", "ip", "none", "default"), ("eval_opt", "sp", "none", "default"),
                           ("eval_opt", "sp", "role_balanced", "default")])
    scaled = next(c for c in cells if c.cell_id == "voting-ip-arith-tiny-m-s20-mitigation=role_count_scaling-setting=fast")
    assert scaled.overrides["mitigation"] == "role_count_scaling"
    assert (scaled.overrides["algo"]["lr"], scaled.overrides["algo"]["ppo_mini_batch_size"]) == (1.5e-3, 2)
    # the paired baseline shares the setting axis (trained the same way) but not the mitigation
    assert scaled.overrides["monitors"]["reference_run"] == "/runs/repro/single-arith-tiny-m-s20-setting=fast"
    baseline = next(c for c in cells if c.cell_id == "single-arith-tiny-m-s20-setting=fast")
    assert (baseline.overrides["algo"]["lr"], baseline.overrides["algo"]["ppo_mini_batch_size"]) == (1.5e-3, 2)
    assert "reference_run" not in baseline.overrides.get("monitors", {})
    assert [c.cell_id for c in cells].index(baseline.cell_id) < [c.cell_id for c in cells].index(scaled.cell_id)
    control = next(c for c in cells if c.cell_id == "eval_opt-sp-arith-tiny-m-s20-mitigation=none-setting=default")
    assert "lr" not in control.overrides.get("algo", {})  # the default update
    assert control.baseline_id == "single-arith-tiny-m-s20-setting=default"
    assert "lr" not in next(c for c in cells if c.cell_id == control.baseline_id).overrides.get("algo", {})
    check_cells(cells[:3], strict=True)


def test_paired_axes_must_name_extra_axes():
    cfg = compose(["sweep=repro", "sweep.paired_axes=[lr]"])
    with pytest.raises(GridError, match="sweep.paired_axes must list extra axes of the sweep \\(mitigation, setting\\)"):
        expand(cfg.sweep, cfg.cluster, "runs")
    cfg = compose(["sweep=repro", "sweep.paired_axes=[]"])  # unpaired: one baseline a seed for both settings
    baselines = [c.cell_id for c in expand(cfg.sweep, cfg.cluster, "runs") if c.is_baseline]
    assert sorted(baselines) == [f"single-arith-tiny-m-s{seed}" for seed in range(20, 25)]


def test_a_bad_exclusion_or_extra_axis_is_one_clear_error():
    for override, message in (("+sweep.exclude=3", "sweep.exclude must be a list of {axis: value} mappings"),
                              ("+sweep.extra_axes.mitigation=7", "sweep.extra_axes.mitigation must be a list")):
        cfg = compose(["sweep=smoke", override])
        with pytest.raises(GridError, match=message.replace("{", r"\{").replace("}", r"\}")):
            expand(cfg.sweep, cfg.cluster, "runs")


def _graph_file(path):
    from tests.test_graph import MY_FLOW

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(MY_FLOW))
    return path


def test_a_graph_file_on_the_topology_axis_expands_into_cells_named_by_its_stem(tmp_path, capsys, monkeypatch):
    _graph_file(tmp_path / "flows" / "my_flow.yaml")
    monkeypatch.chdir(tmp_path)  # a path relative to where the sweep is launched
    axis = ["sweep=smoke", "sweep.axes.topology=[flows/my_flow.yaml,voting]", "+sweep.exclude=[{topology: my_flow, sharing: sp}]"]
    assert main([f"root={tmp_path / 'runs'}", *axis, "dry_run=true"]) == 0
    rows = {line.split()[0]: line for line in dry_run_cells(capsys.readouterr().out)}
    assert set(rows) == {"my_flow-ip-arith-tiny-m-s0", "voting-sp-arith-tiny-m-s0", "voting-ip-arith-tiny-m-s0",
                         "single-arith-tiny-m-s0"}  # the graph's sp cell excluded by its label
    assert all(row.rstrip().endswith(" ok") for row in rows.values())
    assert not (tmp_path / "runs").exists()
    cfg = compose(axis)
    cell = next(c for c in expand(cfg.sweep, cfg.cluster, "runs") if c.cell_id == "my_flow-ip-arith-tiny-m-s0")
    # the cell runs the file wherever its job starts; its axes and baseline read as the named topologies' do
    assert cell.overrides["topology"] == str(tmp_path.resolve() / "flows" / "my_flow.yaml")
    assert cell.axes["topology"] == "my_flow" and cell.baseline_id == "single-arith-tiny-m-s0"


def test_a_graph_file_named_like_a_topology_or_like_another_file_or_broken_is_one_error(tmp_path):
    voting, first, second = (_graph_file(tmp_path / name) for name in ("voting.yaml", "a/my_flow.yaml", "b/my_flow.yaml"))
    broken = tmp_path / "broken.yaml"
    broken.write_text("roles: {}\nnodes: {}\nfinal: x\n")
    for axis, message in (([voting], "has the name of the built-in topology voting: rename the file"),
                          ([first, second], "two graph files are named my_flow"),
                          ([broken], f"topology {broken}: workflow graph broken has no nodes")):
        cfg = compose(["sweep=smoke", f"sweep.axes.topology=[{','.join(map(str, axis))}]"])
        with pytest.raises(GridError, match=message):
            expand(cfg.sweep, cfg.cluster, "runs")


def test_a_graph_files_cell_from_the_sweep_trains(tmp_path, warm_model_dir):
    from harness.run import run_cell
    from harness.validation import config_from_dict

    graph = _graph_file(tmp_path / "my_flow.yaml")
    cfg = compose(["sweep=smoke", f"sweep.axes.topology=[{graph}]", "sweep.axes.sharing=[ip]", "sweep.baseline=false",
                   "sweep.cell.steps=2", "sweep.cell.val_every=1", "sweep.cell.val_problems=4", f"root={tmp_path}"])
    [cell] = expand(cfg.sweep, cfg.cluster, str(tmp_path))
    run_cell(config_from_dict({**cell.overrides, "wandb": {"enabled": False}, "report": False}), log=lambda *_: None)
    run = tmp_path / "smoke" / "my_flow-ip-arith-tiny-m-s0"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1] and "role/judge/accuracy" in metrics[-1]
    assert json.loads((run / "status.json").read_text())["state"] == "finished"


def test_the_unitymas_sweep_takes_the_papers_sharing_on_its_axis():
    cfg = compose(["sweep=unitymas_grpo", "sweep.axes.sharing=[paper]", "sweep.axes.scale=[tiny-s]"])
    cells = expand(cfg.sweep, cfg.cluster, "runs")
    assert sorted(c.cell_id for c in cells if not c.is_baseline) == [
        "mask_search-paper-qa-synth-tiny-s-s0", "qd_retrieve_answer-paper-qa-synth-tiny-s-s0",
        "qd_retrieve_evidence_answer-paper-qa-synth-tiny-s-s0", "reflective_code-paper-code-synth-tiny-s-s0"]
    check_cells(cells, strict=True)


def test_the_unitymas_sweep_trains_ppo_with_gae_under_the_papers_map():
    """sweep=unitymas_grpo trains GRPO under sp / partial / ip; the paper trains PPO with a GAE critic
    under its agents-to-models map: sweep=unitymas is that, every cell of it (baselines too)."""
    from harness.validation import config_from_dict

    cfg = compose(["sweep=unitymas"])
    cells = expand(cfg.sweep, cfg.cluster, "runs")
    check_cells(cells, strict=True)
    resolved = [config_from_dict(c.overrides) for c in cells]
    assert all(r.algo.adv_estimator == "gae" for r in resolved)
    assert {r.topology for r in resolved if r.topology != "single"} == {
        "qd_retrieve_answer", "qd_retrieve_evidence_answer", "mask_search", "reflective_code"}
    assert {r.sharing for r in resolved if r.topology != "single"} == {"paper"}
    assert all(r.algo.gae_scope == "turn" for r in resolved)  # upstream's GAE: every turn its own episode
    paid = {r.topology: r.reward.allocator for r in resolved}
    assert paid.pop("reflective_code") == "harness.allocators:code_turn_level"
    assert paid.pop("mask_search") == "harness.allocators:mask_turn_level" and set(paid.values()) == {None}
    with pytest.raises(GridError, match="sweep.topology_cell names voting, not on the sweep's topology axis"):
        bad = compose(["sweep=unitymas", "+sweep.topology_cell.voting={steps: 3}"])
        expand(bad.sweep, bad.cluster, "runs")


def test_4b_code_cells_start_from_the_studys_warm_started_weights(tmp_path, monkeypatch):
    """examples/deepcoder/train_deepcoder_*.sh start Qwen3-4B code runs from
    checkpoints/init_weight/qwen3_4b_s300_deepcoder; full_matrix's 4B code cells look for it under
    the model root, other cells for the base checkpoints."""
    from grid.expand import task_overrides
    from harness.config import ConfigError
    from harness.models import resolve_model_path
    from harness.config import CellConfig
    from omegaconf import OmegaConf

    code_4b = task_overrides("code", "qwen3-4b", "study", str(tmp_path), "voting")
    math_4b = task_overrides("math", "qwen3-4b", "study", str(tmp_path), "voting")
    code_1b = task_overrides("code", "qwen3-1.7b", "study", str(tmp_path), "voting")
    assert code_4b["model"] == {"dirname": "init_weight/qwen3_4b_s300_deepcoder"}
    assert "model" not in math_4b and "model" not in code_1b
    (tmp_path / "Qwen3-4B").mkdir()
    (tmp_path / "Qwen3-4B" / "config.json").write_text("{}")
    monkeypatch.setenv("MARL_MODEL_ROOT", str(tmp_path))

    def cfg(overrides):
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(CellConfig),
                                                   {"scale": "qwen3-4b", "model": overrides.get("model", {})}))

    assert resolve_model_path(cfg(math_4b)) == tmp_path / "Qwen3-4B"
    with pytest.raises(ConfigError, match="init_weight/qwen3_4b_s300_deepcoder"):
        resolve_model_path(cfg(code_4b))
    (tmp_path / "init_weight" / "qwen3_4b_s300_deepcoder").mkdir(parents=True)
    (tmp_path / "init_weight" / "qwen3_4b_s300_deepcoder" / "config.json").write_text("{}")
    assert resolve_model_path(cfg(code_4b)) == tmp_path / "init_weight" / "qwen3_4b_s300_deepcoder"


def test_an_axis_given_as_a_dict_replaces_the_sweeps_values():
    """'sweep.extra_axes.action={alert:{}}' once merged into the file's {alert, mitigate} and still ran
    the mitigate cells: a studies' arms command branched cells it had not asked for."""
    cfg = compose(["sweep=repro_branch", "sweep.axes.seed=[600]", "sweep.extra_axes.action={alert:{}}"])
    assert list(cfg.sweep.extra_axes.action) == ["alert"]
    ids = [c.cell_id for c in expand(cfg.sweep, cfg.cluster, "runs")]
    assert ids and not any("mitigate" in i for i in ids)
    kept = compose(["sweep=repro_branch", "sweep.axes.seed=[600]"])
    assert sorted(kept.sweep.extra_axes.action) == ["alert", "mitigate"]


def test_cell_ids_name_the_task_the_cell_runs():
    """The `math` axis trains arith on a tiny model and DAPO-Math on Qwen3 with the study's data: the id
    says which. Two task axes that run one task at a scale are one run; an id two different cells would
    share is an error, never a cell silently dropped."""
    cfg = compose(["sweep=smoke"])
    cells = expand(cfg.sweep, cfg.cluster, "runs")
    assert all(f"-{c.overrides['task']}-" in c.cell_id for c in cells)
    assert {c.cell_id for c in cells if c.is_baseline} == {"single-arith-tiny-m-s0"}
    assert all(c.axes["task"] == "math" for c in cells)  # tables still group by the axis
    both = expand(compose(["sweep=smoke", "sweep.axes.task=[math,arith]"]).sweep, cfg.cluster, "runs")
    assert sorted(c.cell_id for c in both) == sorted(c.cell_id for c in cells)
    from dataclasses import replace

    from grid.expand import _add

    one = next(c for c in both if c.cell_id == "voting-ip-arith-tiny-m-s0")
    other = replace(one, axes={**one.axes, "task": "arith"}, overrides={**one.overrides, "steps": 7})
    with pytest.raises(GridError, match="two cells of the sweep would both be voting-ip-arith-tiny-m-s0 with different "
                                        "settings \\(task axes math and arith\\)"):
        _add({one.cell_id: one}, other)
    # a single agent has no sharing mode: its sp and ip twins are one cell
    singles = expand(compose(["sweep=smoke", "sweep.axes.topology=[single]", "sweep.baseline=false"]).sweep, cfg.cluster, "runs")
    assert [c.cell_id for c in singles] == ["single-arith-tiny-m-s0"]
