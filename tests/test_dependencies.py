"""Dependencies are ranges that install beside an existing environment; CI's exact versions live in
constraints.txt, which `make setup` applies; the ranges agree with verl's and with the pinned set."""
import re
import subprocess
from importlib.metadata import distribution

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.conftest import REPO
from tests.dependency_env import (NOT_OVERLAID, cached_venv, dry_run_install, installed_version, lower_bounds,
                                  overlay_env, project_requirements)

# Versions a researcher's environment may already hold: each differs from the one CI pins.
EXISTING = {"pandas": "3.1.0", "matplotlib": "3.11.1", "wandb": "0.30.0"}


def constraints() -> dict:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            [spec] = requirement.specifier
            assert spec.operator == "==", line
            pins[canonicalize_name(requirement.name)] = spec.version
    return pins


def test_requirements_are_ranges_with_a_lower_bound():
    requirements = project_requirements(["dev", "gpu"])
    pinned = [str(r) for r in requirements if any(s.operator in ("==", "===") for s in r.specifier)]
    assert not pinned, f"exact pins in pyproject.toml (CI's exact versions belong in constraints.txt): {pinned}"
    bounds = lower_bounds(requirements)
    assert [str(r) for r in requirements if canonicalize_name(r.name) not in bounds] == []


def test_constraints_pin_a_point_inside_every_range():
    pins = constraints()
    for requirement in project_requirements(["dev"]):
        name = canonicalize_name(requirement.name)
        if name in NOT_OVERLAID:
            assert name not in pins  # installed first by `make setup`, CPU or CUDA build
            continue
        assert name in pins, f"{name} is not pinned in constraints.txt"
        assert requirement.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} outside {requirement}"
    # the pinned set is consistent: every pinned package's own requirements hold among the pins
    broken = []
    for name, version in pins.items():
        dist = distribution(name)
        if Version(dist.version) != Version(version):
            continue  # this environment holds another version: its metadata says nothing about the pin
        for line in dist.requires or []:
            child = Requirement(line)
            other = canonicalize_name(child.name)
            if other in pins and (child.marker is None or child.marker.evaluate({"extra": ""})):
                if not child.specifier.contains(pins[other], prereleases=True):
                    broken.append(f"{name} {version} requires {child}, pinned {pins[other]}")
    assert not broken


def test_ranges_stay_inside_verls_own():
    """verl 0.9.1 pins the stack it was built against (transformers < 5.11, numpy >= 2): a range of ours
    that reaches past verl's would promise versions that cannot be installed together."""
    verl = {canonicalize_name(Requirement(line).name): Requirement(line) for line in distribution("verl").requires
            if Requirement(line).marker is None}
    for ours in project_requirements():
        name = canonicalize_name(ours.name)
        if name not in verl or not verl[name].specifier:
            continue
        edges = {Version(s.version) for s in ours.specifier}
        edges |= {Version(f"{v.major}.{v.minor}.{v.micro + 1}") for v in set(edges)}
        edges |= {Version(f"{v.major}.{v.minor}.{v.micro - 1}") for v in set(edges) if v.micro > 0}
        for version in edges:
            if ours.specifier.contains(version):
                assert verl[name].specifier.contains(version), f"{ours} allows {version}; verl requires {verl[name]}"


def test_make_setup_installs_with_the_constraints(tmp_path):
    dry = subprocess.run(["make", "-n", f"VENV={tmp_path}/venv", "setup"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert dry.returncode == 0, dry.stderr
    cpu_branch = dry.stdout.split("else ", 1)[-1].split("; fi", 1)[0]  # no nvidia-smi: CI's machines
    assert re.search(r'pip install -q -c constraints\.txt -e "\.\[dev\]"', cpu_branch), dry.stdout


def test_installing_keeps_other_patch_versions_already_there(tmp_path):
    """`pip install -e .` into an environment that holds other versions of pandas, matplotlib and wandb
    than CI's: pip would install the project and change none of them."""
    pins = constraints()
    assert all(pins[name] != version for name, version in EXISTING.items())
    env = overlay_env("existing", [f"{name}=={version}" for name, version in sorted(EXISTING.items())])
    assert {name: installed_version(env, name) for name in EXISTING} == EXISTING
    report = dry_run_install(env, tmp_path / "report.json", "-e", str(REPO))
    would_install = {canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"] for item in report["install"]}
    assert "marl-harness" in would_install
    assert {name: would_install[name] for name in EXISTING if name in would_install} == {}


def test_the_dev_tools_open_the_notebook_and_build_the_docs():
    """`SWEEP_DIR=runs/smoke jupyter lab` and `make docs` need jupyterlab and mkdocs: the dev extra brings them."""
    dev = {canonicalize_name(r.name) for r in project_requirements(["dev"])} - {
        canonicalize_name(r.name) for r in project_requirements()}
    assert {"jupyterlab", "mkdocs"} <= dev
    scripts = {ep.name for name in ("jupyterlab", "mkdocs") for ep in distribution(name).entry_points
               if ep.group == "console_scripts"}
    assert {"jupyter-lab", "mkdocs"} <= scripts


def test_a_cached_environment_linking_into_a_removed_tree_is_rebuilt(tmp_path):
    """A cache outlives the worktree whose venv it linked: reusing it would import nothing."""
    source, fills = tmp_path / "worktree-venv", []

    def fill(python, own):
        source.mkdir(exist_ok=True)
        (source / "mod.py").write_text(f"built = {len(fills)}\n")
        fills.append(python)
        (own / "mod.py").symlink_to(source / "mod.py")
        return "mod\n"

    env = cached_venv(tmp_path / "cache" / "env", fill)
    assert cached_venv(tmp_path / "cache" / "env", fill) == env and len(fills) == 1  # reused while intact
    (source / "mod.py").unlink()
    assert cached_venv(tmp_path / "cache" / "env", fill) == env and len(fills) == 2
    imported = subprocess.run([str(env / "bin" / "python"), "-c", "import mod; print(mod.built)"],
                              capture_output=True, text=True, check=True).stdout.strip()
    assert imported == "1"
