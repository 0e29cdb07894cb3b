"""A diagnosis by counterfactual (harness.diagnose): a run branched into resampled `none` arms and
one arm per mechanism removed, and the verdict's statistics (analysis/diagnosis.py)."""
import json
import re
import subprocess
import sys

import pytest

from harness.run_dir import read_jsonl
from tests.conftest import REPO
from tests.test_intervene import run, same_keys

DIAGNOSE = [sys.executable, "-m", "harness.diagnose"]
PARENT = ["topology=voting", "sharing=ip", "steps=8", "ckpt_every=2", "ckpt_keep=10", "val_every=4", "val_problems=8",
          "progress=false", "wandb.enabled=false", "report=false"]
CELL = "voting-ip-arith-tiny-m-s0"


@pytest.fixture(scope="module")
def parent(tmp_path_factory, warm_model_dir):
    root = tmp_path_factory.mktemp("diagnosed")
    run(root, *PARENT)
    return root / "default" / CELL


def test_resampled_none_arms_and_an_unshared_arm_branch_from_one_state(parent):
    args = [str(parent), "--at", "4", "--failure-step", "6", "--margin", "2", "--resamples", "2",
            "--mechanisms", "unshare_instances"]
    dry = subprocess.run(DIAGNOSE + args + ["--dry-run"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert "4 arms, 16 cell-steps" in dry.stdout
    assert "power: with 2 resamples no arm can be told apart from none or from slowing down" in dry.stdout
    assert not (parent.parent.parent / "default-diagnosis").exists()  # a dry run writes nothing

    proc = subprocess.run(DIAGNOSE + args, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    arms = parent.parent.parent / "default-diagnosis"
    want = read_jsonl(parent / "metrics.jsonl")
    replay = read_jsonl(arms / f"{CELL}@4+none~r0" / "metrics.jsonl")
    assert [m["step"] for m in replay] == list(range(8))
    assert all(same_keys(a, b) == [] for a, b in zip(replay, want))  # stream 0: the run itself, key for key
    other = read_jsonl(arms / f"{CELL}@4+none~r1" / "metrics.jsonl")
    assert all(same_keys(a, b) == [] for a, b in zip(other[:4], want[:4]))  # the run's own records before K
    assert same_keys(other[4], want[4]) != []  # stream 1 samples other episodes from the same state
    branch = json.loads((arms / f"{CELL}@4+none~r1" / "branch.json").read_text())
    assert (branch["resample"], branch["start"], branch["failure"]["step"]) == (1, 4, 6)

    unshared = read_jsonl(arms / f"{CELL}@4+unshare_instances~r0" / "metrics.jsonl")
    status = json.loads((arms / f"{CELL}@4+unshare_instances~r0" / "status.json").read_text())
    assert status["state"] == "finished"
    assert set(status["policies"]) == {"aggregator", "voter_0", "voter_1", "voter_2"}
    assert all(same_keys(a, b) == [] for a, b in zip(unshared[:4], want[:4]))
    # from the branch each voter steps its own copy once a step, where the shared adapter stepped three times
    assert [m["policy/voter/optimizer_steps"] for m in want[4:6]] == [3, 3]
    assert all(m[f"policy/voter_{i}/optimizer_steps"] == 1 for m in unshared[4:] for i in range(3))
    # each copy starts where the shared adapter was (its drift counts from the run's start, not from zero)
    assert all(unshared[4][f"policy/voter_{i}/drift"] > 0.6 * want[3]["policy/voter/drift"] for i in range(3))

    verdict = json.loads((parent / "diagnosis.json").read_text())
    point = verdict["points"][0]
    assert point["start"] == 4 and point["resamples"] == 2 and set(point["arms"]) == {"unshare_instances"}
    assert verdict["lines"][0].startswith("given at step 6 — diagnosis: ")
    assert verdict["lines"][0] in proc.stdout
    from reports.run_report import build_run_report

    report = build_run_report(parent)  # the run's report carries the verdict under its own
    assert f"**Diagnosis:** {verdict['lines'][0]}" in (report.parent / "report.md").read_text()

    # a study of kind diagnosis collects these arms into its outcomes and renders the same verdict
    from analysis.studies import KINDS, _load_kinds, study_named, write_outcomes

    studies = parent.parent.parent / "studies"
    (studies / "planted").mkdir(parents=True)
    (studies / "planted" / "study.yaml").write_text(
        "name: planted\nkind: diagnosis\nheld_out: {seeds: '0'}\nruns: {arms: default-diagnosis}\n"
        "mechanisms: {ip: [unshare_instances]}\nhypotheses:\n  - {id: H1, sharing: ip, mechanism: unshare_instances, "
        "claim: un-sharing saves more}\n")
    _load_kinds()
    study = study_named("planted", studies)
    collect, render = KINDS["diagnosis"]
    write_outcomes(study, collect(study, parent.parent.parent))
    rows = study_named("planted", studies).outcomes()
    assert len(rows) == 4 and {r["arm"] for r in rows} == {"none", "unshare_instances"}
    assert {(r["failure_kind"], r["failure_step"]) for r in rows} == {("given", "6")}
    blocks = render(study, rows)
    assert blocks["verdicts"].startswith(f"- `{CELL}` (ip): given at step 6 — diagnosis: ")
    assert re.search(r"\| ip\s+\| unshare_instances\s+\| 1\s+\|", blocks["mechanisms"])  # one failed run
    assert "not shown: on ip failures, unshare_instances saves more" in blocks["mechanisms"]  # no slow_down arm ran
    assert blocks["hypotheses"].startswith("- **H1** (un-sharing saves more): ")
    # the README's line: each cell's diagnosis per sharing mode against the study's account, then the tests
    named = json.loads((parent / "diagnosis.json").read_text())["points"][0]["verdict"]
    assert blocks["headline"].startswith(f"on held-out seeds 0 (1 failed cells diagnosed, 4 arms run), each cell's "
                                         f"diagnosis: IP: {named} 1 (the study's account, amplification: "
                                         f"{int(named == 'amplification')} of 1). Across cells: H1 (ip, unshare_instances): not shown")

    # over a planted sweep (runs.base), every base cell counts, failed or not: planted x diagnosed
    import shutil

    import yaml

    base = parent.parent.parent / "planted_base" / CELL
    shutil.copytree(parent, base)
    cell = yaml.safe_load((base / "cell.yaml").read_text())
    cell["extra"] = {**(cell.get("extra") or {}), "planted": "amplification"}
    (base / "cell.yaml").write_text(yaml.safe_dump(cell))
    (studies / "planted" / "study.yaml").write_text(
        "name: planted\nkind: diagnosis\nheld_out: {seeds: '0'}\nruns: {arms: default-diagnosis, base: planted_base}\n")
    study = study_named("planted", studies)
    write_outcomes(study, collect(study, parent.parent.parent))
    rows = study_named("planted", studies).outcomes()
    assert [(r["split"], r["cell"], r["planted"]) for r in rows if r["split"] == "base"] == [("base", CELL, "amplification")]
    blocks = render(study, rows)
    assert re.search(r"\| amplification\s+\|.*", blocks["confusion"])
    assert blocks["confusion"].endswith(f"{int(named == 'amplification')} of 1 diagnosed failures with a planted registry "
                                        f"cause named it; 0 of 0 with the cause outside the registry were given a "
                                        f"mechanism (aim: all and none).")


@pytest.mark.parametrize("args,message", [
    (["--at", "4", "--failure-step", "6", "--mechanisms", "boredom"],
     "unknown mechanism 'boredom'; valid: unshare_instances, role_count_scaling, unshare_roles"),
    (["--at", "7", "--failure-step", "3", "--margin", "2"], "branch point 7 is step 7, outside the arms' steps 1..4"),
    (["--at", "4", "--failure-step", "6", "--resamples", "0"], "--resamples must be >= 1, got 0"),
    (["--at", "4", "--failure-step", "60"], "--failure-step 60 is outside the run's steps 1..7"),
    (["--at", "4"], "did not fail (no failure label) and raised no alert: nothing to diagnose"),
    (["--at", "4", "--failure-step", "6", "--mechanisms", "unshare_roles"],
     "mechanism unshare_roles does not apply to voting-ip-arith-tiny-m-s0: no policy is shared by several roles"),
    (["--at", "4", "--failure-step", "6", "--rule", "vibes"],
     "unknown verdict rule 'vibes'; valid choices: failures, failures-or-accuracy"),
])
def test_bad_input_is_one_error_line_and_writes_nothing(parent, args, message):
    before = sorted(str(p) for p in parent.parent.parent.rglob("*"))
    proc = subprocess.run(DIAGNOSE + [str(parent), *args], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and message in proc.stderr and proc.stderr.count("\n") == 1
    assert sorted(str(p) for p in parent.parent.parent.rglob("*")) == before


def _rows(failed: dict) -> list:
    """Arms' rows as analysis.arms.collect_arms gives them: arm -> per resample, failed or not."""
    return [{"arm": arm, "resample": j, "start": 10, "failed_at": 20 if f else None, "final_accuracy": 0.0 if f else 0.5}
            for arm, flags in failed.items() for j, f in enumerate(flags)]


@pytest.mark.parametrize("failed,verdict", [
    ({"none": [1] * 6, "unshare_instances": [0] * 6, "slow_down": [1] * 6}, "amplification"),
    ({"none": [1] * 6, "unshare_instances": [0] * 6, "slow_down": [0] * 6}, "generic"),
    ({"none": [1] * 6, "unshare_instances": [0] * 5 + [1], "slow_down": [1] * 6}, "undetermined"),  # 5 of 6: p = 0.06
    ({"none": [0] * 6, "unshare_instances": [0] * 6, "slow_down": [0] * 6}, "undetermined"),  # chance never failed
])
def test_a_mechanism_is_named_only_when_it_beats_chance_and_slowing_down(failed, verdict):
    from analysis.diagnosis import point_verdict

    got = point_verdict(_rows(failed), {"kind": "collapse", "step": 20})
    assert got["verdict"] == verdict, got["line"]
    assert got["line"].startswith(f"collapse at step 20 — diagnosis: {verdict} (")


@pytest.mark.parametrize("slow_down_accuracy,unshared_fail,failures_rule,accuracy_rule", [
    (0.3, 0, "generic", "amplification"),  # slowing down saved every stream but learned less: named by accuracy
    (0.5, 0, "generic", "generic"),  # it kept as much: nothing beyond slowing down
    (0.3, 1, "generic", "generic"),  # the arm failed like none (an outside cause): never named
])
def test_the_accuracy_rule_names_a_mechanism_that_keeps_learning_where_slowing_down_does_not(
        slow_down_accuracy, unshared_fail, failures_rule, accuracy_rule):
    from analysis.diagnosis import point_verdict

    rows = _rows({"none": [1] * 6, "unshare_instances": [unshared_fail] * 6, "slow_down": [0] * 6})
    for row in rows:
        if row["arm"] == "slow_down":
            row["final_accuracy"] = slow_down_accuracy
    failure = {"kind": "collapse", "step": 20}
    assert point_verdict(rows, failure)["verdict"] == failures_rule  # the preregistered rule: nothing beats it
    got = point_verdict(rows, failure, "failures-or-accuracy")
    assert got["verdict"] == accuracy_rule and got["rule"] == "failures-or-accuracy", got["line"]
    if accuracy_rule == "amplification":
        assert "slowing down: 0 of 6, but it kept +0.200 accuracy over slowing down, p = 0.031" in got["line"]
        assert got["arms"]["unshare_instances"]["keeps_more_than_slow_down"]
    from harness.config import ConfigError

    with pytest.raises(ConfigError, match="unknown verdict rule 'vibes'; valid choices: failures, failures-or-"):
        point_verdict(rows, failure, "vibes")


def test_the_planted_sweep_reads_as_a_confusion_matrix(tmp_path):
    """Planted cause x diagnosed verdict from each run's cell.yaml (its `planted` axis) and
    diagnosis.json; the summary says how it meets the aim (every registry cause named, none for the
    outside cause). The planted sweep itself expands with one cause per sharing mode where it acts."""
    import json

    import yaml

    from analysis.diagnosis import confusion, confusion_summary, mechanism_table, sweep_diagnoses
    from grid.expand import expand
    from grid.launch import compose, setting_of

    def run(name, planted, verdicts):
        d = tmp_path / "diagnose_planted" / name
        d.mkdir(parents=True)
        (d / "cell.yaml").write_text(yaml.safe_dump({"cell_id": name, "topology": "voting", "sharing": "ip",
                                                     "extra": {"planted": planted}}))
        (d / "metrics.jsonl").write_text("")
        if verdicts is not None:
            (d / "diagnosis.json").write_text(json.dumps({
                "failure": {"kind": "collapse", "step": 60},
                "points": [{"verdict": v} for v in verdicts], "lines": [f"collapse at step 60 — diagnosis: {verdicts[0]}"]}))

    run("a1", "amplification", ["undetermined", "amplification"])
    run("a2", "amplification", ["generic"])
    run("l1", "length_drift", ["length drift"])
    run("o1", "outside", ["generic"])
    run("o2", "outside", ["capture"])
    run("o3", "outside", None)  # never failed
    rows = sweep_diagnoses(tmp_path / "diagnose_planted")
    table = confusion(rows).set_index("planted")
    assert table.loc["amplification", "amplification"] == 1 and table.loc["amplification", "generic"] == 1
    assert table.loc["outside", "capture"] == 1 and table.loc["outside", "did not fail"] == 1
    assert confusion_summary(rows).startswith("2 of 3 diagnosed failures with a planted registry cause named it; "
                                              "1 of 2 with the cause outside the registry were given a mechanism")
    assert mechanism_table(rows)["generic"].tolist() == [2]
    cfg = compose(["sweep=diagnose_planted"])
    cells = [c for c in expand(cfg.sweep, cfg.cluster, "runs") if not c.is_baseline]
    planted = {(c.axes["sharing"], c.overrides["extra"]["planted"]) for c in cells}
    assert planted == {("ip", "amplification"), ("ip", "length_drift"), ("ip", "outside"),
                       ("sp", "capture"), ("sp", "outside")}
    # diagnose.limit counts per setting: the seeds of one planted cause share one, each cause has its own
    settings = {}
    for cell in cells:
        settings.setdefault(setting_of(cell), set()).add(cell.axes["seed"])
    assert len(settings) == 5 and all(seeds == {700, 701, 702} for seeds in settings.values())


def test_the_grid_diagnoses_a_real_collapse_and_a_relaunch_runs_nothing(tmp_path, warm_model_dir):
    """A cell that really collapses (the learning rate x100 on steps 4-5), launched, then
    action=diagnose: the plan first (nothing written), then the arms as cells of `<sweep>-diagnosis`,
    the verdict in the run and in the sweep report, and a second diagnose submits nothing."""
    sweep = ["sweep=smoke", f"root={tmp_path}", "sweep.axes.topology=[voting]", "sweep.axes.sharing=[ip]",
             "sweep.axes.seed=[0]", "sweep.baseline=false", "sweep.cell.steps=10", "sweep.cell.val_every=2",
             "sweep.cell.val_problems=8", "sweep.cell.ckpt_every=2", "sweep.cell.ckpt_keep=100",
             "sweep.cell.report=false", "sweep.cell.algo.lr_spike_factor=100", "sweep.cell.algo.lr_spike_start=4",
             "sweep.cell.algo.lr_spike_steps=2"]
    launched = subprocess.run([sys.executable, "grid/launch.py", *sweep], cwd=REPO, capture_output=True, text=True,
                              timeout=300)
    assert launched.returncode == 0, launched.stdout[-2000:] + launched.stderr[-2000:]
    run = tmp_path / "smoke" / "voting-ip-arith-tiny-m-s0"
    from analysis.labels import collapse_label

    label = collapse_label(read_jsonl(run / "metrics.jsonl"))
    assert label is not None and label.step > 2, launched.stdout[-2000:]
    diagnose = [sys.executable, "grid/launch.py", *sweep, "action=diagnose", "diagnose.at=[label-2]",
                "diagnose.resamples=1", "diagnose.margin=2", "diagnose.mechanisms=[unshare_instances]"]
    dry = subprocess.run(diagnose + ["dry_run=true"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]
    assert "1 failed cells, 2 arms" in dry.stdout and "dry run: nothing written" in dry.stdout
    assert not (tmp_path / "smoke-diagnosis").exists() and not (run / "diagnosis.json").exists()

    proc = subprocess.run(diagnose, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    arms = tmp_path / "smoke-diagnosis"
    start = label.step - 2
    for mechanism in ("none", "unshare_instances"):
        status = json.loads((arms / f"{run.name}@{start}+{mechanism}~r0" / "status.json").read_text())
        assert status["state"] == "finished" and status["step"] == label.step + 2
    replay = read_jsonl(arms / f"{run.name}@{start}+none~r0" / "metrics.jsonl")
    want = read_jsonl(run / "metrics.jsonl")
    assert all(same_keys(a, b) == [] for a, b in zip(replay[:-1], want))  # stream 0 repeats the run to its horizon,
    assert [k for k in same_keys(replay[-1], want[len(replay) - 1]) if not k.startswith("val/")] == []  # +its last val
    verdict = json.loads((run / "diagnosis.json").read_text())
    assert verdict["failure"]["step"] == label.step and verdict["points"][0]["start"] == start
    line = verdict["lines"][0]
    assert line.startswith(f"collapse at step {label.step} — diagnosis: ") and f"{run.name}: {line}" in proc.stdout
    report = (tmp_path / "smoke" / "report" / "report.md").read_text()
    assert "## Why the failed runs failed" in report and "## Diagnoses by topology x sharing" in report
    again = subprocess.run(diagnose, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "nothing to submit" in again.stdout  # idempotent, as a launch is
