"""The folder a bare GPU machine needs beside its own Python to run bench/gpu_check.py.

Such a machine has no network and takes in 64 MiB beside the repository; its Python has torch,
transformers, peft and a few more (GPU_MACHINE below, from the machine's own listing). This script,
run where the project is installed, runs the check in its tiny mode, reads the imports of every
module of this repository it loaded, maps the packages they name to the distributions that provide
them, drops those the GPU machine has (with their dependencies) and downloads cp312 manylinux
wheels of the rest, at the versions installed here. It adds Qwen3's tokenizer (checksums pinned, harness/qwen3_tokenizer.py) and fails above
60 MiB. The folder is built aside and renamed into place, so a failure leaves nothing behind.

    python bench/gpu_bundle.py --out gpu_bundle      # make gpu-bundle
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Dict, Iterable, List, Set

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LIMIT_MIB = 60
# The GPU machine's Python 3.12 (../shared/notes/gpu-device.md): these and their dependencies.
GPU_MACHINE = ("torch", "transformers", "peft", "accelerate", "safetensors", "tokenizers", "pandas", "matplotlib",
               "scipy", "statsmodels", "pytest", "jinja2", "pyarrow")
WHEEL_TAGS = ("--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
              "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
              "--platform", "manylinux2014_x86_64")
class BundleError(RuntimeError):
    """The bundle cannot be made as asked; the message says why."""


def closure(names: Iterable[str]) -> Set[str]:
    """The distributions `names` install, with everything they require (as installed here)."""
    seen: Set[str] = set()
    todo = [canonicalize_name(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(requirement.name))
    return seen


def loaded_modules(python: str = sys.executable) -> Dict[str, str]:
    """{module: its file or ""} of every module loaded by a real run of the check's tiny mode."""
    with tempfile.TemporaryDirectory() as work:
        listing = Path(work) / "modules.json"
        code = ("import json, runpy, sys\n"
                f"sys.argv = ['gpu_check', '--tiny', '--out', {work!r}, '--repeats', '1']\n"
                "try:\n"
                f"    runpy.run_path({str(REPO / 'bench' / 'gpu_check.py')!r}, run_name='__main__')\n"
                "except SystemExit as exc:\n"
                "    if exc.code:\n"
                "        raise\n"
                "files = {n: getattr(m, '__file__', None) or '' for n, m in list(sys.modules.items())}\n"
                f"json.dump(files, open({str(listing)!r}, 'w'))\n")
        proc = subprocess.run([python, "-c", code], cwd=REPO, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BundleError(f"the check's tiny run failed, so its imports are unknown:\n{proc.stderr[-3000:]}")
        return json.loads(listing.read_text())


def own_imports(loaded: Dict[str, str]) -> Set[str]:
    """Top-level packages that this repository's loaded modules import by name and that were loaded:
    what the check needs. A library's optional imports (protobuf when it happens to be installed)
    are left to the library, which the GPU machine has with its own dependencies."""
    names: Set[str] = set()
    for module, path in loaded.items():
        source = Path(path)
        if (not source.is_absolute() or source.suffix != ".py" or not source.is_file()
                or not source.resolve().is_relative_to(REPO) or "site-packages" in source.parts):
            continue
        for node in ast.walk(ast.parse(Path(path).read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    top_loaded = {m.split(".")[0] for m in loaded}
    return {n for n in names if n in top_loaded and n not in sys.stdlib_module_names}


def missing_distributions(modules: Iterable[str]) -> Dict[str, str]:
    """{distribution: version installed here} of `modules`' providers that the GPU machine lacks."""
    providers = metadata.packages_distributions()
    have = closure(GPU_MACHINE)
    missing: Dict[str, str] = {}
    for module in modules:
        for dist in providers.get(module, []):
            name = canonicalize_name(dist)
            if name not in have and name != "marl-harness":
                missing[name] = metadata.version(name)
    return missing


def size_mib(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2 ** 20


def build(out: Path, limit_mib: float = LIMIT_MIB) -> dict:
    """Make the bundle at `out` (replacing an older one only once the new one is complete)."""
    from harness import qwen3_tokenizer
    from harness.checkpoints import sha256_of

    reason = qwen3_tokenizer.problem()
    if reason:
        raise BundleError(reason)
    modules = sorted(own_imports(loaded_modules()))
    missing = missing_distributions(modules)
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        wheels = staging / "wheels"
        wheels.mkdir()
        for name, version in sorted(missing.items()):
            proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *WHEEL_TAGS,
                                   "-d", str(wheels), f"{name}=={version}"], capture_output=True, text=True)
            if proc.returncode != 0:
                raise BundleError(f"no cp312 manylinux wheel of {name}=={version}: {proc.stderr.strip()[-500:]}")
        shutil.copytree(qwen3_tokenizer.tokenizer_dir(), staging / "qwen3-tokenizer")
        total = size_mib(staging)
        if total > limit_mib:
            raise BundleError(f"the bundle is {total:.1f} MiB, over the {limit_mib:g} MiB limit "
                              f"(wheels: {', '.join(p.name for p in wheels.iterdir()) or 'none'})")
        manifest = {"limit_mib": limit_mib, "size_mib": round(total, 2), "gpu_machine_has": list(GPU_MACHINE),
                    "imports": modules, "bundled_distributions": missing,
                    "files": {str(p.relative_to(staging)): sha256_of(p) for p in sorted(staging.rglob("*"))
                              if p.is_file()}}
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
        return manifest
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "gpu_bundle")
    parser.add_argument("--limit-mib", type=float, default=LIMIT_MIB)
    args = parser.parse_args(argv)
    try:
        manifest = build(args.out, args.limit_mib)
    except BundleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    bundled = ", ".join(f"{k}=={v}" for k, v in manifest["bundled_distributions"].items()) or "none needed"
    print(f"{args.out}: {manifest['size_mib']} MiB (limit {manifest['limit_mib']:g}); wheels: {bundled}; "
          f"Qwen3 tokenizer included")
    return 0


if __name__ == "__main__":
    sys.exit(main())
