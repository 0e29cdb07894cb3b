"""Selection pressure (role/<r>/selection_<signal>: the covariance of a role's turn advantages with
its length, format or own accuracy) and the detectors that read it: a short-contract role paid to
change its length is flagged before its length moves, and noise, pressure on answer roles, or
pressure away from the other role never fires."""
import math
import random

from harness.config import MonitorConfig
from harness.instrument.rollout import rollout_metrics, selection
from harness.monitors.detectors import CaptureDetector, LengthDriftDetector, SelectionWindow
from harness.tasks import Problem
from harness.episodes import Episode, Turn
from tests.test_detectors import CFG, EVAL_OPT_SP, VOTING_SP, fired


def _turn(role, length, advantage, malformed=False, role_correct=None, index=0):
    return Turn(role=role, instance=0, policy="shared", prompt="p", prompt_ids=[1], response_ids=[7] * length,
                text="x", truncated=False, index=index, malformed=malformed, role_correct=role_correct,
                advantage=advantage)


def _episodes(rows):
    """One episode per (aggregator length, advantage, malformed) row, two voters each."""
    episodes = []
    for i, (length, advantage, malformed) in enumerate(rows):
        turns = [_turn("voter", 3, advantage, index=0), _turn("voter", 3, advantage, index=1),
                 _turn("aggregator", length, advantage, malformed=malformed, role_correct=advantage > 0, index=2)]
        episodes.append(Episode(problem=Problem(str(i), "q", "1"), turns=turns, group=i // 4))
    return episodes


def test_selection_is_the_covariance_of_advantage_and_signal_with_its_error():
    rng = random.Random(0)
    rows = [(2 + (k := rng.randint(0, 6)), 0.4 * k - 1.2 + rng.gauss(0, 0.3), k > 3) for _ in range(64)]
    metrics = rollout_metrics(_episodes(rows))
    lengths, advantages = [r[0] for r in rows], [r[1] for r in rows]
    ml, ma = sum(lengths) / 64, sum(advantages) / 64
    expected = sum((x - ml) * (a - ma) for x, a in zip(lengths, advantages)) / 64
    assert math.isclose(metrics["role/aggregator/selection_length"], expected, rel_tol=1e-9)
    assert metrics["role/aggregator/selection_length"] / metrics["role/aggregator/selection_length_se"] > 5
    assert metrics["role/aggregator/selection_format"] < 0  # the longer, malformed answers are paid more
    assert metrics["role/aggregator/selection_accuracy"] > 0
    # the voters' length never varies: no pressure, and nothing to divide by
    assert metrics["role/voter/selection_length"] == 0 and metrics["role/voter/selection_length_se"] == 0
    # independent advantages: the covariance is within a few errors of 0
    noise = rollout_metrics(_episodes([(2 + rng.randint(0, 6), rng.gauss(0, 1), False) for _ in range(64)]))
    assert abs(noise["role/aggregator/selection_length"]) < 3.5 * noise["role/aggregator/selection_length_se"]


def test_selection_error_is_clustered_by_episode():
    """A role's turns in one episode share their advantage: duplicating every turn of an episode adds no
    information, so the covariance stays and its error must not shrink by sqrt(2)."""
    rng = random.Random(1)
    episodes = _episodes([(2 + rng.randint(0, 6), rng.gauss(0, 1), False) for _ in range(32)])
    signal = lambda t: float(len(t.response_ids))
    once = selection(episodes, "aggregator", signal)
    for e in episodes:
        e.turns += [t for t in e.turns if t.role == "aggregator"]
    twice = selection(episodes, "aggregator", signal)
    assert math.isclose(once[0], twice[0], rel_tol=1e-9) and math.isclose(once[1], twice[1], rel_tol=1e-9)
    assert selection(episodes[:1], "aggregator", signal) is None  # one episode: nothing to compare


def test_length_net_of_the_job_removes_what_doing_the_job_pays():
    """A verdict-paid evaluator: right verdicts are the longer ones and the advantage is the verdict's
    correctness, so its length is under pressure, but none beyond its job; an outcome-paid one whose
    short verdicts are paid whether right or wrong is under pressure net of its job too."""
    rng = random.Random(2)
    rows, paid_short = [], []
    for i in range(64):
        right = rng.random() < 0.5
        length = (9 if right else 6) + rng.randint(-1, 1)
        rows.append((length, (1.0 if right else -1.0) + rng.gauss(0, 0.1), right))
        paid_short.append((length, -0.5 * (length - 7.5) + rng.gauss(0, 0.3), right))

    def evaluator_episodes(rows):
        return [Episode(problem=Problem(str(i), "q", "1"), group=i // 4,
                        turns=[_turn("evaluator", length, advantage, role_correct=right)])
                for i, (length, advantage, right) in enumerate(rows)]

    verdict = rollout_metrics(evaluator_episodes(rows))
    assert verdict["role/evaluator/selection_length"] > 5 * verdict["role/evaluator/selection_length_se"]
    assert abs(verdict["role/evaluator/selection_length_net"]) < 3 * verdict["role/evaluator/selection_length_net_se"]
    outcome = rollout_metrics(evaluator_episodes(paid_short))
    assert outcome["role/evaluator/selection_length_net"] < -5 * outcome["role/evaluator/selection_length_net_se"]
    # a role never judged at its own job (the voters here) has no net figure
    assert "role/voter/selection_length_net" not in rollout_metrics(_episodes([(2, 1.0, False), (5, -1.0, True)]))


def test_validation_logs_no_selection():
    """Validation episodes have no advantages: a selection there would read as 'no pressure'."""
    metrics = rollout_metrics(_episodes([(2, 1.0, False), (5, -1.0, True)]), prefix="val/", selection_pressure=False)
    assert not [k for k in metrics if "selection" in k]


def _pressure(role, cov, se, length):
    return {f"role/{role}/selection_length": cov, f"role/{role}/selection_length_se": se,
            f"role/{role}/response_length": length}


def test_selection_window_sums_steps_over_their_pooled_error():
    window = SelectionWindow(4)
    for s in range(3):
        window.update({**_pressure("aggregator", 0.2, 0.1, 2.0), "step": s}, "aggregator", "length")
        assert window.z is None  # not full yet
    window.update(_pressure("aggregator", 0.2, 0.1, 2.0), "aggregator", "length")
    assert math.isclose(window.z, 0.8 / math.sqrt(4 * 0.01)) and math.isclose(window.per_step, 0.2)
    window.update({"role/aggregator/selection_length": float("nan"), "role/aggregator/selection_length_se": 0.1},
                  "aggregator", "length")  # a non-finite step is not counted
    assert math.isclose(window.z, 4.0)


def test_length_drift_warns_of_a_paid_role_before_its_length_moves():
    rng = random.Random(2)
    # the aggregator is paid per token: its advantage co-varies with its length (z ~ 5 a step) while
    # its mean length still sits at its index's 2 tokens
    paid = [{"step": s, **_pressure("aggregator", 0.3 + rng.gauss(0, 0.06), 0.06, 2.0 + rng.gauss(0, 0.1)),
             **_pressure("voter", rng.gauss(0, 0.05), 0.05, 3.0)} for s in range(30)]
    alerts = fired(LengthDriftDetector(CFG.drift, VOTING_SP), paid)
    assert alerts and alerts[0].role == "aggregator" and "is paid to lengthen" in alerts[0].message
    assert alerts[0].step == CFG.drift.pressure_window - 1 + CFG.drift.patience - 1 and alerts[0].value > 4
    # the evaluator pushed shorter
    short = [{"step": s, **_pressure("evaluator", -0.2 + rng.gauss(0, 0.05), 0.05, 7.0)} for s in range(30)]
    alerts = fired(LengthDriftDetector(CFG.drift, EVAL_OPT_SP), short)
    assert alerts and "is paid to shorten" in alerts[0].message and alerts[0].value < 0


def test_length_drift_silent_on_noise_and_on_answer_roles():
    rng = random.Random(3)
    # no pressure: each step's covariance is drawn around 0 with its own error, 300 steps
    noise = [{"step": s, **_pressure("aggregator", rng.gauss(0, 0.05), 0.05, 2.0 + rng.gauss(0, 0.1))}
             for s in range(300)]
    assert not fired(LengthDriftDetector(CFG.drift, VOTING_SP), noise)
    # voters paid to grow (an answer role): ordinary RL, never an alert on its own
    voters = [{"step": s, **_pressure("voter", 0.5, 0.05, 3.0 + 0.05 * s), **_pressure("aggregator", 0.0, 0.05, 2.0)}
              for s in range(60)]
    assert not fired(LengthDriftDetector(CFG.drift, VOTING_SP), voters)
    # an evaluator paid for its verdicts, whose right verdicts are the longer ones: pressure on its
    # length, none beyond its job; read net of its job it is silent, read raw it fires
    verdict = [{"step": s, **_pressure("evaluator", 0.4, 0.05, 7.0 + 0.05 * s),
                "role/evaluator/selection_length_net": rng.gauss(0, 0.05),
                "role/evaluator/selection_length_net_se": 0.05} for s in range(60)]
    assert not fired(LengthDriftDetector(CFG.drift, EVAL_OPT_SP), verdict)
    raw = MonitorConfig().drift
    raw.pressure_net = False
    assert "is paid to lengthen its answers: over" in fired(LengthDriftDetector(raw, EVAL_OPT_SP), verdict)[0].message
    paid = [{**r, "role/evaluator/selection_length_net": -0.3} for r in verdict]
    assert "beyond its job" in fired(LengthDriftDetector(CFG.drift, EVAL_OPT_SP), paid)[0].message
    cfg = MonitorConfig().drift
    cfg.pressure_z = None  # off: the paid stream passes unflagged while the length holds
    paid = [{"step": s, **_pressure("aggregator", 0.3, 0.05, 2.0)} for s in range(40)]
    assert not fired(LengthDriftDetector(cfg, VOTING_SP), paid)


def _eval_opt(cov, evaluator_len=7.0, generator_len=3.0, generator_cov=0.0):
    return {**_pressure("evaluator", cov, 0.05, evaluator_len), **_pressure("generator", generator_cov, 0.05,
                                                                            generator_len),
            "role/generator/format_ok": 1.0, "role/evaluator/format_ok": 1.0,
            "role/generator/accuracy": 0.3, "role/evaluator/accuracy": 0.5}


def test_capture_warns_of_a_role_paid_toward_another_before_it_moves():
    rng = random.Random(4)
    toward = [{"step": s, **_eval_opt(-0.2 + rng.gauss(0, 0.05))} for s in range(30)]
    alerts = fired(CaptureDetector(CFG.capture, EVAL_OPT_SP), toward)
    assert alerts and alerts[0].role == "evaluator" and "paid to move its length toward generator's" in alerts[0].message
    assert alerts[0].step < 20  # its length and contract never moved in this stream


def test_capture_pressure_is_direction_aware():
    rng = random.Random(5)
    # the evaluator pushed longer, away from the generator's 3 tokens: not capture
    away = [{"step": s, **_eval_opt(0.2 + rng.gauss(0, 0.05))} for s in range(40)]
    assert not fired(CaptureDetector(CFG.capture, EVAL_OPT_SP), away)
    # the generator (an answer role) pushed toward the evaluator's length: not watched for pressure
    generator = [{"step": s, **_eval_opt(0.0, generator_cov=0.3)} for s in range(40)]
    assert not fired(CaptureDetector(CFG.capture, EVAL_OPT_SP), generator)
    # no pressure at all, 300 steps of noise
    noise = [{"step": s, **_eval_opt(rng.gauss(0, 0.05))} for s in range(300)]
    assert not fired(CaptureDetector(CFG.capture, EVAL_OPT_SP), noise)
