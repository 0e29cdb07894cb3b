"""The README is a front door (short, cites its papers, speaks of the project only, every link and
cheap command works), the docs state what the configuration says, and the docs site builds with
every internal link and anchor checked."""
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = sorted(DOCS.glob("*.md"))
PROCESS_WORDS = [r"\bissues?\b", r"\bsessions?\b", r"\btickets?\b", r"\bthis machine\b", r"\bwas lent\b",
                 r"\bno device\b", r"\bhelper\b"]
CHEAP = ("--help", "dry_run=true", "action=status")  # a README command with one of these is run by the test
NEEDS_YOUR_SITE = ("/path/to", "<")  # a command that names something only the reader has is not


def fenced_blocks(text: str):
    """(language, body) of every fenced code block."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)


def prose(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def slug(heading: str) -> str:
    """A heading's anchor as both GitHub and MkDocs write it for the headings these pages use."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return re.sub(r"[ ]+", "-", text.strip())


def anchors(page: Path) -> set:
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", prose(page.read_text()), flags=re.M)}


def test_the_readme_is_a_short_front_door_that_cites_its_papers():
    text = README.read_text()
    assert len(text.splitlines()) < 200
    for needed in ("https://arxiv.org/abs/2605.24202", "When Does Multi-Agent RL Improve LLM Workflows?",  # the study
                   "https://arxiv.org/abs/2605.26646", "UnityMAS-O: A General RL Optimization Framework",   # UnityMAS-O
                   "https://github.com/volcengine/verl", "https://github.com/XHMY/marl-llm-workflows"):
        assert needed in text, needed
    for section in ("## Install", "## Two commands", "## A sweep", "## Where outputs go", "## Results in pandas",
                    "## Read a report", "## Detectors"):
        assert section in text, section
    # no screenshot on the front door: the reports page shows them, regenerated from a real run
    assert "![" not in text


def test_the_docs_are_a_manual_of_short_pages():
    """Long pages were lab notebooks: a page that grows past 300 lines is split or its notes moved to a study."""
    assert {p.name: n for p in PAGES if (n := len(p.read_text().splitlines())) > 300} == {}


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.name)
def test_pages_speak_of_the_project_only(page):
    text = page.read_text()
    found = [m.group(0) for word in PROCESS_WORDS for m in re.finditer(word, text, flags=re.I)]
    assert not found, f"{page.name}: {found}"


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(page.read_text())):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(target)
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(target)
    assert not broken, f"{page.name}: {broken}"


def test_every_docs_page_starts_with_what_a_reader_gets():
    for page in PAGES:
        lines = [line for line in page.read_text().splitlines() if line.strip()]
        assert lines[0].startswith("# ") and "What you get from this" in lines[1], page.name


def test_the_response_budgets_in_the_docs_are_the_configs():
    """The docs once said 1024-token math responses in one place and 5120 in another; the config is
    the truth (grid/conf/task/<axis>.yaml, checkpoint_budgets)."""
    budgets = {axis: yaml.safe_load((REPO / "grid" / "conf" / "task" / f"{axis}.yaml").read_text())
               ["checkpoint_budgets"]["default"]["workflow"]["max_new_tokens"] for axis in ("math", "code")}
    stated = []
    for page in [README, *PAGES]:
        text = " ".join(page.read_text().split())
        stated += [(page.name, axis, int(n)) for n, axis in re.findall(r"(\d+)-token responses for (math|code)", text)]
        stated += [(page.name, axis, int(n)) for axis, n in re.findall(r"\| (math|code) \| (\d+) \|", text)]
        stated += [(page.name, axis, int(n)) for axis, n in re.findall(r"every role: (math|code) (\d+)", text)]
    assert {axis for _, axis, _ in stated} == {"math", "code"}  # the study's page states both
    assert [s for s in stated if s[2] != budgets[s[1]]] == []


def mkdocs_build(root: Path, site: Path) -> subprocess.CompletedProcess:
    mkdocs = Path(sys.executable).with_name("mkdocs")
    return subprocess.run([str(mkdocs), "build", "--strict", "--config-file", str(root / "mkdocs.yml"),
                           "--site-dir", str(site)], capture_output=True, text=True, timeout=120)


def test_the_docs_site_builds_and_fails_on_a_broken_link(tmp_path):
    built = mkdocs_build(REPO, tmp_path / "site")
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "site" / "detectors" / "index.html").is_file()
    # the same site with one broken anchor and one missing page: the build refuses it
    copy = tmp_path / "copy"
    shutil.copytree(DOCS, copy / "docs")
    shutil.copy(REPO / "mkdocs.yml", copy / "mkdocs.yml")
    with open(copy / "docs" / "index.md", "a") as page:
        page.write("\n[gone](glossary.md#no-such-term) [missing](no-such-page.md)\n")
    broken = mkdocs_build(copy, tmp_path / "broken-site")
    assert broken.returncode != 0
    assert "no-such-term" in broken.stderr and "no-such-page.md" in broken.stderr


def cheap_commands(text: str):
    """The README's shell commands marked cheap by what they do (--help, a dry run, a status), and its
    Python blocks (loading results)."""
    commands = []
    for language, body in fenced_blocks(text):
        if language == "python":
            commands.append(("python", body))
        elif language == "bash":
            for line in body.splitlines():
                words = shlex.split(line, comments=True)
                if any(w in CHEAP for w in words) and not any(s in line for s in NEEDS_YOUR_SITE):
                    commands.append(("bash", words))
    return commands


def test_the_readmes_cheap_commands_run(small_sweep, tmp_path):
    """Run as a reader would from a checkout's root, with `runs/smoke` a real small sweep."""
    work = tmp_path / "checkout"
    (work / "runs").mkdir(parents=True)
    (work / "runs" / "smoke").symlink_to(small_sweep)
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "offline"}
    commands = cheap_commands(README.read_text())
    kinds = {marker for _, c in commands if isinstance(c, list) for marker in CHEAP if marker in c}
    assert kinds == set(CHEAP) and any(kind == "python" for kind, _ in commands)
    failed = []
    for kind, command in commands:
        if kind == "python":
            argv = [sys.executable, "-c", command]
        else:
            argv = [sys.executable if w == ".venv/bin/python" else str(REPO / w) if w.endswith(".py") else w
                    for w in command]
        proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0 or "Traceback" in proc.stderr or not proc.stdout.strip():
            failed.append(f"{' '.join(command) if kind == 'bash' else command}\n-> {proc.returncode}: "
                          f"{proc.stderr[-800:]}")
    assert not failed, "\n\n".join(failed)
