"""Open reports in a real headless Chromium (Debian's, as `make test` installs it) and save what a
reader sees: the test suite checks the pages this way, and the screenshots in docs/ are made by it
from a real run, so they always show what today's reports show.

    python -m reports.screenshots runs/smoke [--cell voting-ip-arith-tiny-m-s0] [--out docs]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Optional, Sequence


def find_chromium() -> str:
    """The browser `make test` installs (Debian's chromium), found on PATH or named by $CHROMIUM."""
    for candidate in (os.environ.get("CHROMIUM"), shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and Path(candidate).is_file():
            return candidate
    raise FileNotFoundError("no Chromium found: `make system` installs Debian's chromium, "
                            "or set CHROMIUM=/path/to/chromium")


def open_in_chromium(url: str, screenshot: Path, width: int = 1200, height: int = 900) -> dict:
    """Loads `url`, saves a full-page screenshot and returns what the page did: console errors,
    dialogs, whether each image loaded, and its links."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=find_chromium(), args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        page = browser.new_page(viewport={"width": width, "height": height})
        errors, dialogs = [], []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto(url)
        page.wait_for_load_state("load")
        images = page.evaluate("Array.from(document.images).map(i => i.complete && i.naturalWidth > 0)")
        links = page.evaluate("Array.from(document.querySelectorAll('a')).map(a => a.href)")
        page.screenshot(path=str(screenshot), full_page=True)
        browser.close()
    return {"errors": errors, "dialogs": dialogs, "images": images, "links": links}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path, help="a sweep directory whose runs have ended")
    parser.add_argument("--cell", default="voting-ip-arith-tiny-m-s0", help="the run whose report is shown")
    parser.add_argument("--out", type=Path, default=Path("docs"))
    args = parser.parse_args(argv)
    from reports.run_report import build_run_report
    from reports.sweep_report import build_sweep_report

    run = args.sweep / args.cell
    if not (run / "cell.yaml").is_file():
        print(f"error: {run} is not a run directory (no cell.yaml)", file=sys.stderr)
        return 2
    pages = {"run-report.png": build_run_report(run), "sweep-report.png": build_sweep_report(args.sweep, run_reports=False)}
    for name, page in pages.items():
        seen = open_in_chromium(Path(page).resolve().as_uri(), args.out / name)
        if seen["errors"] or not all(seen["images"]):
            print(f"error: {page} did not render cleanly: {seen['errors'] or 'an image did not load'}", file=sys.stderr)
            return 1
        print(f"{args.out / name}: {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
