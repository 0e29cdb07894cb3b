"""The command line as a Hydra user types it, read before Hydra sees it, so each habit that does not
apply to one cell gets one line saying what to write instead:

- `+key=value` for a key the schema does not have is refused with the closest keys (Hydra would add
  it, and the typed config would drop it without a word); under a free-form dict (`reward.per_role`,
  `workflow.role_max_new_tokens`, ...) a new key is what `+` is for, and is kept;
- `-m` / `--multirun` and sweep values (`seed=0,1`, `seed=range(0,3)`): one cell runs here; a sweep
  is `grid/launch.py` with the values on an axis;
- `--flag value` / `--flag=value`: options are `key=value`;
- `--cfg job` prints the resolved cell config (with `--resolve` too) and runs nothing.
"""
from __future__ import annotations

import difflib
from typing import List, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

SWEEP_HINT = ("one cell runs here; to run several values use the grid launcher with the values on an axis, "
              "e.g. python grid/launch.py sweep=smoke 'sweep.axes.seed=[0,1]'")


class OverrideError(ValueError):
    """A command-line argument this entry point does not take; the message says what to write."""


def print_config_request(argv: Sequence[str]) -> Optional[List[str]]:
    """The overrides when argv asks for the resolved config (`--cfg job`, `--cfg=job`, also with
    `--resolve`), else None."""
    args = list(argv)
    forms = (["--cfg", "job"], ["-c", "job"])
    at = next((i for i, a in enumerate(args) if a == "--cfg=job" or args[i:i + 2] in forms), None)
    if at is None:
        return None
    del args[at:at + (1 if args[at] == "--cfg=job" else 2)]
    return [a for a in args if a != "--resolve"]


LIST_HINT = "the launcher expands lists, not Hydra's sweeps: write the values as a list, e.g. 'sweep.axes.seed=[0,1]'"


def check_overrides(argv: Sequence[str], schema) -> None:
    """Raises OverrideError for the first argument a one-cell Hydra command line should not carry."""
    for override in parse_habits(argv, SWEEP_HINT):
        if override.is_add():
            _check_new_key(OmegaConf.structured(schema), override.key_or_group)


def parse_habits(argv: Sequence[str], sweep_hint: str) -> list:
    """Hydra's parse of argv (empty where Hydra cannot parse it: it says why itself), after refusing
    -m/--multirun, --flags and sweep values with `sweep_hint`."""
    for i, arg in enumerate(argv):
        if arg in ("-m", "--multirun"):
            raise OverrideError(f"{arg}: {sweep_hint}")
        if arg.startswith("-"):
            name, _, value = arg.lstrip("-").partition("=")
            if name in ("cfg", "c"):
                raise OverrideError(f"{arg}: only '--cfg job' is supported here (it prints the resolved cell config)")
            following = argv[i + 1] if i + 1 < len(argv) and "=" not in argv[i + 1] else "<value>"
            example = f"{name.replace('-', '_')}={value or following}"
            raise OverrideError(f"{arg}: options are key=value, e.g. {example} (every key: --help)")
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        parsed = OverridesParser.create().parse_overrides(list(argv))
    except OverrideParseException:
        return []  # Hydra says what is wrong with it
    for override in parsed:
        if override.is_sweep_override():
            raise OverrideError(f"{override.input_line}: {sweep_hint}")
    return parsed


def close_keys(name: str, valid: Sequence[str], prefix: str = "") -> str:
    """"; did you mean a, b?" for the valid names close to `name` (each after `prefix`), else ""."""
    close = difflib.get_close_matches(name, list(valid), n=3, cutoff=0.6)
    return f"; did you mean {', '.join(prefix + c for c in close)}?" if close else ""


def _check_new_key(root: DictConfig, key: str) -> None:
    node = root
    parts = key.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(node, DictConfig):
            return  # a list or a value: Hydra says what is wrong
        if OmegaConf.get_type(node) is dict:
            return  # a free-form dict: new keys are what `+` is for
        if part not in node:
            where = ".".join(parts[:depth])
            valid = [str(k) for k in node.keys()]
            raise OverrideError(f"+{key}: the config has no key '{part}'{' under ' + where if where else ''}"
                                f"{close_keys(part, valid, where + '.' if where else '')} (valid keys{' of ' + where if where else ''}: {', '.join(valid)})")
        node = node._get_node(part)


def dotted_keys(node: DictConfig, prefix: str = "") -> List[str]:
    """Every key of a structured config as a dotted path (free-form dicts: the dict itself, not its keys)."""
    paths = []
    for key in node.keys():
        path = f"{prefix}{key}"
        paths.append(path)
        child = node._get_node(key)
        if isinstance(child, DictConfig) and OmegaConf.get_type(child) is not dict:
            paths += dotted_keys(child, path + ".")
    return paths


def closest_dotted(key: str, schema) -> str:
    """"; did you mean algo.lr?" for `lr` or `algo.lrr`: the schema's dotted keys whose last part is
    (close to) the key's last part, else whose whole path is close; else ""."""
    paths = dotted_keys(OmegaConf.structured(schema))
    last = key.rsplit(".", 1)[-1]
    exact = [p for p in paths if p.rsplit(".", 1)[-1] == last and p != key]
    if exact:
        return f"; did you mean {', '.join(exact[:3])}?"
    whole = difflib.get_close_matches(key, paths, n=3, cutoff=0.75)
    if whole:
        return f"; did you mean {', '.join(whole)}?"
    lasts = difflib.get_close_matches(last, sorted({p.rsplit('.', 1)[-1] for p in paths}), n=2, cutoff=0.75)
    near = [p for p in paths if p.rsplit(".", 1)[-1] in lasts]
    return f"; did you mean {', '.join(near[:3])}?" if near else ""


def in_free_dict(key: str, schema) -> bool:
    """`key` (dotted) is one of the schema's free-form dicts (algo.kl_coef_per_role) or lies under one
    (workflow.prompts.voter): setting it may add a name its defaults lack."""
    node = OmegaConf.structured(schema)
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node and OmegaConf.get_type(node) is not dict:
            return False
        if OmegaConf.get_type(node) is dict:
            return True
        node = node._get_node(part)
    return isinstance(node, DictConfig) and OmegaConf.get_type(node) is dict


def is_schema_key(key: str, schema) -> bool:
    """`key` (dotted) names a key of the schema, or lies under one of its free-form dicts."""
    node = OmegaConf.structured(schema)
    for part in key.split("."):
        if not isinstance(node, DictConfig) or OmegaConf.get_type(node) is dict:
            return True
        if part not in node:
            return False
        node = node._get_node(part)
    return True
