"""Open a report in real headless Chromium (Debian's, via Playwright) and screenshot it.

Used by the tests and by ``python -m hil.report.screenshot REPORT.html OUT.png``. The
browser gets no network: a self-contained page must render fully offline.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def chromium() -> str | None:
    for name in ("/usr/bin/chromium", "chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


def screenshot(html: Path, png: Path) -> dict[str, object]:
    """Render ``html``; return what the page showed (title, verdict, svg count, errors)."""
    from playwright.sync_api import sync_playwright

    exe = chromium()
    if exe is None:
        raise FileNotFoundError("chromium not installed")
    errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 900})
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(html.resolve().as_uri())
            page.screenshot(path=str(png), full_page=True)
            info = {
                "title": page.title(),
                "verdict": page.inner_text(".verdict"),
                "svgs": page.locator("svg.chart").count(),
                "rows": page.locator("table tr").count(),
                "errors": errors,
                "foreign_requests": [u for u in requests if not u.startswith("file:")],
            }
        finally:
            browser.close()
    return info


if __name__ == "__main__":
    print(screenshot(Path(sys.argv[1]), Path(sys.argv[2])))
