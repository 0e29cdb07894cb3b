"""wandb as researchers expect it: WANDB_* environment variables win over the harness's defaults, a
value set in the config wins over both, and every run directory has its own wandb run id."""
import pytest

from harness.wandb_sink import read_wandb_offline, wandb_run_id, wandb_settings
from harness.validation import ConfigError
from tests.conftest import cell


@pytest.fixture()
def no_wandb_env(monkeypatch):
    for name in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_unset_settings_take_the_environment_then_the_defaults(tmp_path, no_wandb_env):
    assert wandb_settings(cell(tmp_path)) == {"mode": "offline", "project": "marl-harness", "entity": None}
    no_wandb_env.setenv("WANDB_MODE", "online")
    no_wandb_env.setenv("WANDB_PROJECT", "myproj")
    no_wandb_env.setenv("WANDB_ENTITY", "mylab")
    assert wandb_settings(cell(tmp_path)) == {"mode": "online", "project": "myproj", "entity": "mylab"}
    # a value set on the command line (or in a sweep) wins over the environment
    assert wandb_settings(cell(tmp_path, "wandb.mode=offline", "wandb.project=other")) == \
        {"mode": "offline", "project": "other", "entity": "mylab"}
    no_wandb_env.setenv("WANDB_MODE", "dryrun")  # wandb's old name for offline
    assert wandb_settings(cell(tmp_path))["mode"] == "offline"


def test_a_bad_mode_from_the_environment_is_one_clear_error(tmp_path, no_wandb_env):
    no_wandb_env.setenv("WANDB_MODE", "sometimes")
    with pytest.raises(ConfigError, match=r"unknown wandb mode .*'sometimes'; valid choices: offline, online, disabled"):
        cell(tmp_path, "wandb.enabled=true")


def test_each_run_directory_has_its_own_id_kept_across_resumes(tmp_path):
    first, second = tmp_path / "a" / "runs" / "default" / "voting-ip-s0", tmp_path / "b" / "runs" / "default" / "voting-ip-s0"
    first.mkdir(parents=True)
    second.mkdir(parents=True)
    run_id = wandb_run_id(first)
    assert wandb_run_id(first) == run_id  # a resume continues the same wandb run
    assert wandb_run_id(second) != run_id  # same root name, sweep and cell id elsewhere: another run
    moved = tmp_path / "moved"
    first.rename(moved)
    assert wandb_run_id(moved) == run_id


def test_a_trained_cell_logs_to_the_project_the_environment_names(tmp_path, no_wandb_env, warm_model_dir):
    from harness.run import run_cell

    no_wandb_env.setenv("WANDB_PROJECT", "myproj")  # WANDB_MODE unset: offline, the harness's default
    cfg = cell(tmp_path, "steps=1", "val_every=100", "wandb.enabled=true")
    assert run_cell(cfg, log=lambda *_: None) == "finished"
    run_dir = tmp_path / cfg.sweep / cfg.cell_id
    [log] = list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    run = next(r.run for r in read_wandb_offline(log) if r.WhichOneof("record_type") == "run")
    assert run.project == "myproj" and run.run_id == (run_dir / "wandb-run-id").read_text().strip()
