"""Failure labels from metric streams: they mark real failures, from the right step, and stay
silent on noise, on ordinary length growth and on a job signal that falls without the role
drifting toward another's."""
import json
import random
import subprocess
import sys

from analysis.labels import capture_labels, collapse_label, contract_labels, label_records
from tests.conftest import REPO


def validations(accuracies, se=0.02, every=10):
    return [{"step": i * every, "val/accuracy": a, "val/accuracy_se": se} for i, a in enumerate(accuracies)]


def test_collapse_is_relative_to_the_running_best_and_to_the_standard_error():
    # a low-accuracy model collapsing (0.25 -> 0.08): an absolute 0.2 drop would never see it
    label = collapse_label(validations([0.20, 0.25, 0.24, 0.10, 0.08, 0.07], se=0.02))
    assert label is not None and label.step == 30
    # a dip that recovers is not a collapse (needs 2 validations in a row)
    assert collapse_label(validations([0.5, 0.55, 0.3, 0.56, 0.3, 0.55])) is None
    # the same drop within the noise (SE 0.1 on 16 problems) is not a collapse either
    assert collapse_label(validations([0.5, 0.55, 0.36, 0.35, 0.34], se=0.1)) is None
    assert collapse_label(validations([0.5, 0.55, 0.36, 0.35, 0.34], se=0.02)).step == 20


def _stream(steps, lengths, formats, noise=0.0, seed=0):
    """Voting-like records: voter and aggregator lengths and the aggregator's format compliance by step."""
    rng = random.Random(seed)
    records = []
    for step in range(steps):
        records.append({
            "step": step,
            "role/voter/response_length": 6.0 + rng.gauss(0, noise),
            "role/aggregator/response_length": lengths(step) + rng.gauss(0, noise),
            "role/voter/format_ok": 1.0,
            "role/aggregator/format_ok": formats(step),
        })
    return records


def test_capture_marks_an_aggregator_that_writes_like_the_voters_and_stops_picking():
    records = _stream(120, lengths=lambda s: 1.0 if s < 50 else min(6.0, 1.0 + (s - 50) * 0.1),
                      formats=lambda s: 1.0 if s < 50 else max(0.2, 1.0 - (s - 50) * 0.02), noise=0.1)
    [label] = capture_labels(records)
    assert label.role == "aggregator" and 60 <= label.step <= 90, label


def test_capture_stays_silent_on_length_growth_alone_and_on_a_fall_without_approach():
    grows = _stream(120, lengths=lambda s: 1.0 + s * 0.05, formats=lambda s: 1.0, noise=0.1)
    assert capture_labels(grows) == []  # its format holds: ordinary length growth
    away = _stream(120, lengths=lambda s: 1.0, formats=lambda s: 1.0 if s < 50 else 0.3, noise=0.1)
    assert capture_labels(away) == []  # its job signal fell but it did not move toward the voters
    steady = _stream(120, lengths=lambda s: 1.0, formats=lambda s: 1.0, noise=0.5, seed=3)
    assert label_records(steady + validations([0.5] * 12)) == []


def test_contract_marks_a_role_that_stops_following_its_format_wherever_its_length_goes():
    # the aggregator writes 12 tokens instead of an index (away from the voters' 6): contract, not capture
    away = _stream(120, lengths=lambda s: 1.0 if s < 40 else 12.0, formats=lambda s: 1.0 if s < 40 else 0.1,
                   noise=0.1)
    [label] = contract_labels(away)
    assert label.kind == "contract" and label.role == "aggregator" and 40 <= label.step <= 46, label
    assert capture_labels(away) == []
    # a format that wobbles (0.8-1.0) is not a broken contract
    wobble = _stream(120, lengths=lambda s: 1.0, formats=lambda s: 0.8 if s % 3 == 0 else 1.0)
    assert contract_labels(wobble) == []


def test_labels_cli_reads_run_directories(tmp_path):
    run = tmp_path / "sweep" / "voting-ip-arith-tiny-m-s0"
    run.mkdir(parents=True)
    (run / "cell.yaml").write_text("topology: voting\n")
    records = _stream(120, lengths=lambda s: 1.0 if s < 50 else min(6.0, 1.0 + (s - 50) * 0.1),
                      formats=lambda s: 1.0 if s < 50 else 0.2)
    for r, v in zip(records[::10], validations([0.5, 0.6, 0.6, 0.2, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1])):
        r.update(v)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    proc = subprocess.run([sys.executable, "-m", "analysis.labels", str(tmp_path / "sweep")], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "collapse at step 30" in proc.stdout and "capture at step" in proc.stdout and "(aggregator)" in proc.stdout
    assert "1 runs: 1 capture, 1 collapse" in proc.stdout
    empty = subprocess.run([sys.executable, "-m", "analysis.labels", str(tmp_path / "nothing")], cwd=REPO,
                           capture_output=True, text=True, timeout=60)
    assert empty.returncode == 2 and "no run directory" in empty.stderr

