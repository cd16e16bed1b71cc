"""Take screenshots of the main pages (for looking at them): sign-in, dashboard, job list, form, job page.

Usage: ``.venv/bin/python scripts/screenshots.py BASE_URL OUT_DIR [USERNAME PASSWORD]`` against a running
portal. Uses Debian's Chromium (``/usr/bin/chromium``) through Playwright; downloads no browser.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

DEMO_PASSWORD = "federated-demo-2026"  # noqa: S105 — the demo seed's password (demo/seed.py)

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def main(base: str, out: Path, username: str = "ada", password: str = DEMO_PASSWORD) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1360, "height": 900})
        page.goto(f"{base}/accounts/login/")
        page.screenshot(path=out / "01-sign-in.png", full_page=True)
        page.fill("input[name=login]", username)
        page.fill("input[name=password]", password)
        page.click("button[type=submit]")
        page.wait_for_url(re.compile(r".*/$"))
        page.screenshot(path=out / "02-dashboard.png", full_page=True)
        page.goto(f"{base}/jobs/")
        page.screenshot(path=out / "03-job-list.png", full_page=True)
        page.goto(f"{base}/jobs/new/")
        page.screenshot(path=out / "04-job-form.png", full_page=True)
        page.click("button[type=submit]")  # empty form: inline errors
        page.screenshot(path=out / "05-job-form-errors.png", full_page=True)
        link = page.goto(f"{base}/jobs/") and page.locator("table a").first
        if link.count():
            link.click()
            page.wait_for_timeout(1500)
            page.screenshot(path=out / "06-job-page.png", full_page=True)
        browser.close()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), *sys.argv[3:5])
