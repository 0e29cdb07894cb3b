"""Throwaway environments for checking the dependency ranges in pyproject.toml.

An overlay environment is a fresh venv whose own site-packages holds a few packages at chosen
versions and sees every other package through the running environment's site-packages (a .pth
file, searched after its own). So "an environment that already has pandas 3.1.0" costs one small
install instead of a whole stack, and environments are cached by what they hold.

    python -m tests.dependency_env lowest        # every lower bound at once, then the tests that use them
    python -m tests.dependency_env constraints   # the exact versions of this environment, for constraints.txt
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path
from typing import Callable, Dict, List, Sequence

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
# Lower bounds that no overlay can install here: torch's is the CUDA build the GPU path uses
# (PyPI's torch wheels for Linux are CUDA builds of several GB); CI runs the CPU build of 2.13.
NOT_OVERLAID = {"torch"}
# What the lowest versions are checked with: the loaders and reports (pandas, matplotlib, the
# notebook), a short real run with its offline wandb file, the grid's Hydra composition.
LOWEST_TESTS = ["tests/test_analysis_load.py", "tests/test_analysis_reports.py", "tests/test_grid_expand.py",
                "tests/test_diagnostic_runs.py::test_amplification_fires_on_the_faster_adapter_not_on_ip_instance_nor_when_scaled"]


BUILD = "overlay 2"  # how an environment is built: a change here rebuilds the cached ones


def cache_root() -> Path:
    return Path(os.environ.get("MARL_CACHE", Path.home() / ".cache" / "marl-harness")) / "dep-envs"


def pip(python: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, check=check)


def base_site_packages() -> str:
    """The running environment's site-packages by its real path (a worktree's linked venv resolves to
    the venv itself), so a cache keyed by it never outlives what it links."""
    return str(Path(sysconfig.get_paths()["purelib"]).resolve())


def cached_venv(target: Path, fill: Callable[[Path, Path], str]) -> Path:
    """A venv at `target`, built once: `fill(python, site_packages)` populates it and returns what
    `.ready` records; built aside and renamed, so a half-built one is never reused."""
    if (target / ".ready").is_file():
        if _intact(target):
            return target
        shutil.rmtree(target, ignore_errors=True)  # it points into a removed tree (a deleted worktree's venv)
    building = target.with_name(f"{target.name}.building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    venv.EnvBuilder(with_pip=True, symlinks=True).create(building)
    python = building / "bin" / "python"
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    (building / ".ready").write_text(fill(python, Path(own)))
    try:
        building.rename(target)
    except OSError:  # built meanwhile by another process: keep theirs
        shutil.rmtree(building, ignore_errors=True)
    return target


def _intact(env: Path) -> bool:
    """Whether every link and base path in the environment's site-packages still exists."""
    for site in env.glob("lib/python*/site-packages"):
        for entry in site.iterdir():
            if entry.is_symlink() and not entry.exists():
                return False
            if entry.suffix == ".pth" and entry.name.startswith("zz_"):
                if not all(Path(line).is_dir() for line in entry.read_text().split()):
                    return False
    return True


def overlay_env(name: str, pins: Sequence[str]) -> Path:
    """A venv holding `pins` (exact `name==version` lines) over this environment's packages; built
    once per (interpreter, base environment, pins) and reused."""
    base = base_site_packages()
    key = hashlib.sha1("\n".join([BUILD, sys.version, base, *sorted(pins)]).encode()).hexdigest()[:12]

    def fill(python: Path, own: Path) -> str:
        (own / "zz_base_environment.pth").write_text(base + "\n")  # searched after the venv's own packages
        pip(python, "uninstall", "-q", "-y", "setuptools", check=False)  # ensurepip's older copy would shadow the base's
        if pins:
            pip(python, "install", "-q", "--no-deps", *pins)
        return "\n".join(pins) + "\n"

    return cached_venv(cache_root() / f"{name}-{key}", fill)


def python_of(env: Path) -> Path:
    return env / "bin" / "python"


def installed_version(env: Path, package: str) -> str:
    return subprocess.run([str(python_of(env)), "-c", f"from importlib.metadata import version; print(version({package!r}))"],
                          capture_output=True, text=True, check=True).stdout.strip()


def project_requirements(extras: Sequence[str] = ()) -> List[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def lower_bounds(requirements: Sequence[Requirement]) -> Dict[str, str]:
    """{package: its `>=` bound} for every requirement that has one."""
    bounds = {}
    for requirement in requirements:
        for spec in requirement.specifier:
            if spec.operator == ">=":
                bounds[canonicalize_name(requirement.name)] = spec.version
    return bounds


def dry_run_install(env: Path, report: Path, *targets: str) -> dict:
    """What `pip install <targets>` would change in `env`, as pip's JSON installation report."""
    import json

    proc = pip(python_of(env), "install", "--dry-run", "--quiet", "--no-build-isolation", "--report", str(report),
               *targets, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"pip install --dry-run failed:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(report.read_text())


def lowest() -> int:
    """Every lower bound of pyproject.toml installed at once over this environment, checked by pip
    and by the tests that exercise those packages."""
    from importlib.metadata import version as installed
    from packaging.version import Version

    bounds = {name: version for name, version in lower_bounds(project_requirements()).items() if name not in NOT_OVERLAID}
    print("lowest versions:", " ".join(f"{name}=={version}" for name, version in sorted(bounds.items())), flush=True)
    # a bound that is already this environment's version needs no second copy
    pins = [f"{name}=={version}" for name, version in sorted(bounds.items()) if Version(installed(name)) != Version(version)]
    env = overlay_env("lowest", pins)
    python = python_of(env)
    check = pip(python, "check", check=False)
    # the installed project's own metadata may predate this checkout's pyproject.toml: its requirements
    # are the bounds above, so only the other packages' complaints count
    problems = [line for line in (check.stdout + check.stderr).splitlines()
                if line.strip() and not line.lower().startswith(("marl-harness ", "no broken"))]
    print("\n".join(problems) or "pip check: no broken requirements among the other packages", flush=True)
    if problems:
        return 1
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *LOWEST_TESTS],
                          cwd=REPO, env=environment).returncode


def installed_closure(requirements: Sequence[Requirement]) -> Dict[str, str]:
    """{package: installed version} for the requirements and everything they require, as this
    environment resolved them (markers evaluated, requested extras followed)."""
    from importlib.metadata import PackageNotFoundError, distribution

    found: Dict[str, str] = {}
    pending = [(r, frozenset(r.extras)) for r in requirements]
    seen = set()
    while pending:
        requirement, extras = pending.pop()
        name = canonicalize_name(requirement.name)
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue  # an optional requirement this platform does not take
        found[name] = dist.version
        for line in dist.requires or []:
            child = Requirement(line)
            wanted = child.marker is None or any(child.marker.evaluate({"extra": e}) for e in (extras or {""}))
            if wanted:
                pending.append((child, frozenset(child.extras)))
    return found


CONSTRAINTS_HEADER = """\
# The exact versions CI installs (`make setup` applies this file with pip -c on CPU machines).
# pyproject.toml holds the ranges the project supports; this file is one tested point in them.
# Regenerate from a working .venv: make constraints
"""


def constraints_text() -> str:
    pins = installed_closure(project_requirements(["dev"]))
    lines = [f"{name}=={pins[name]}" for name in sorted(pins) if name not in NOT_OVERLAID and name != "marl-harness"]
    return CONSTRAINTS_HEADER + "\n".join(lines) + "\n"


if __name__ == "__main__":
    commands = {"lowest": lowest, "constraints": lambda: print(constraints_text(), end="") or 0}
    if len(sys.argv) != 2 or sys.argv[1] not in commands:
        print(f"error: usage: python -m tests.dependency_env {{{'|'.join(commands)}}}", file=sys.stderr)
        sys.exit(2)
    sys.exit(commands[sys.argv[1]]())
