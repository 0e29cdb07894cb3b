"""Each config section declares its fields' choices and ranges beside the field (harness/config.py
`choice` and `ranged`), and one walk checks them all: a bad value anywhere is one ConfigError naming
the key and what it takes, without a line of validate() per field."""
import copy
from dataclasses import fields, is_dataclass

import pytest

from harness.config import RANGES, CellConfig, ConfigError, ModelInstanceConfig, check_fields

OUTSIDE = {">0": 0, ">=0": -1, ">=1": 0, ">=2": 1, ">1": 1.0, "[0,1]": 1.5, "(0,1]": 0}


def declared(section, where=""):
    """(dotted key, path of attribute names, metadata) of every field that declares a choice or range."""
    for spec in fields(section):
        value = getattr(section, spec.name)
        if is_dataclass(value):
            yield from declared(value, f"{where}{spec.name}.")
        elif "choices" in spec.metadata or "range" in spec.metadata:
            yield f"{where}{spec.name}", spec.metadata


def get_key(cfg, key):
    for name in key.split("."):
        cfg = getattr(cfg, name)
    return cfg


def set_key(cfg, key, value):
    *parents, name = key.split(".")
    node = cfg
    for parent in parents:
        node = getattr(node, parent)
    setattr(node, name, value)


DECLARED = list(declared(CellConfig()))


def test_the_defaults_pass_and_the_declarations_cover_every_section():
    check_fields(CellConfig())
    sections = {key.rsplit(".", 1)[0] for key, _ in DECLARED if "." in key}
    assert {"algo", "reward", "workflow", "verl", "local", "data", "monitors", "monitors.collapse"} <= sections
    assert set(RANGES) == set(OUTSIDE)


@pytest.mark.parametrize("key,meta", DECLARED, ids=[k for k, _ in DECLARED])
def test_every_declared_field_rejects_a_value_outside_it(key, meta):
    cfg = copy.deepcopy(CellConfig())
    if "choices" in meta:
        set_key(cfg, key, "no-such-choice")
        with pytest.raises(ConfigError, match="unknown .*'no-such-choice'; valid choices: ") as err:
            check_fields(cfg)
        assert "." not in key or f"({key})" in str(err.value)  # a nested key is named
    else:
        bad = OUTSIDE[meta["range"]]
        bad = float(bad) if isinstance(get_key(cfg, key), float) else bad
        set_key(cfg, key, bad)
        with pytest.raises(ConfigError, match=f"^{key} must be "):
            check_fields(cfg)
        set_key(cfg, key, float("nan"))
        with pytest.raises(ConfigError, match=f"^{key} must be .*, got nan"):
            check_fields(cfg)


def test_fixed_choices_are_typed_and_a_cell_carries_their_members_as_strings(tmp_path):
    """A choice whose options config.py knows is a StrEnum field (registries' names, like task and scale, stay
    str): a cell holds the member whichever way it came in, and it compares, formats and is stored as its string."""
    from enum import EnumMeta
    from typing import get_type_hints

    import yaml
    from omegaconf import OmegaConf

    from harness.config import Action, LossAgg
    from harness.validation import config_from_dict, load_config

    typed = [(key, meta["choices"]) for key, meta in DECLARED if isinstance(meta.get("choices"), EnumMeta)]
    assert len(typed) >= 25
    for key, kind in typed:
        parent, _, name = key.rpartition(".")
        hint = get_type_hints(type(get_key(CellConfig(), parent) if parent else CellConfig()))[name]
        assert kind in (hint, *getattr(hint, "__args__", ())), key
        assert get_key(CellConfig(), key) is None or isinstance(get_key(CellConfig(), key), kind), key
    for cfg in (load_config(["algo.loss_agg=role-balanced", f"root={tmp_path}"]),
                config_from_dict({"algo": {"loss_agg": "role-balanced"}, "root": str(tmp_path)})):
        assert cfg.algo.loss_agg is LossAgg["role-balanced"] and cfg.monitors.drift.action is Action.alert
        assert cfg.algo.loss_agg == "role-balanced" and f"{cfg.algo.loss_agg}" == "role-balanced"
        stored = yaml.safe_load(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
        assert stored["algo"]["loss_agg"] == "role-balanced" and type(stored["algo"]["loss_agg"]) is str
    # OmegaConf refuses the value on the command line before check_fields sees it: the same one line
    with pytest.raises(ConfigError, match=r"^unknown loss aggregation \(algo.loss_agg\) 'sum'; valid choices: "):
        load_config(["algo.loss_agg=sum"])


def test_model_instances_are_checked_by_their_own_declarations():
    cfg = CellConfig()
    cfg.models = {"a": ModelInstanceConfig(roles=["voter"], train="half")}
    with pytest.raises(ConfigError, match=r"unknown training mode \(models.a.train\) 'half'; valid choices: lora, full"):
        check_fields(cfg)
    cfg.models = {"a": ModelInstanceConfig(roles=["voter"], lr=-1.0)}
    with pytest.raises(ConfigError, match=r"^models.a.lr must be a finite number > 0, got -1.0"):
        check_fields(cfg)


def test_validate_keeps_no_per_field_choice_checks():
    """validate() keeps the rules between sections; a field's own choices live on the field."""
    import inspect

    from harness import validation

    source = inspect.getsource(validation.validate)
    for key, meta in DECLARED:
        if "choices" in meta:
            assert f"cfg.{key}," not in source, f"validate() still checks {key}'s choices itself"
