"""Take screenshots of the billing pages (for looking at them): prices (and its form's errors),
an institution's billing page, an invoice, and a job page's cost card.

Usage: ``.venv/bin/python scripts/billing_screenshots.py BASE_URL OUT_DIR [INSTITUTION]`` against
a running portal seeded with ``demo_seed`` and some billed jobs; signs in as the demo's
institution admin ``admin-a`` and researcher ``ada``. Uses Debian's Chromium through Playwright.
"""

from __future__ import annotations

import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

from scripts.screenshots import CHROMIUM_ARGS, DEMO_PASSWORD


def _login(page, base: str, username: str) -> None:
    page.goto(f"{base}/accounts/login/")
    page.fill("input[name=login]", username)
    page.fill("input[name=password]", DEMO_PASSWORD)
    page.press("input[name=password]", "Enter")
    page.wait_for_url(lambda url: "/accounts/login" not in url)


def main(base: str, out: Path, institution: str = "st-aurelia") -> None:
    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1360, "height": 900})
        _login(page, base, "admin-a")
        page.goto(f"{base}/accounting/institutions/{institution}/prices/")
        page.screenshot(path=out / "b1-prices.png", full_page=True)
        page.fill("input[name=effective_from]", "2020-01-01")
        page.fill("input[name=cpu_weight]", "-1")
        page.fill("input[name=price_per_unit]", "")
        page.click("form button[type=submit]")
        page.screenshot(path=out / "b2-prices-errors.png", full_page=True)
        page.goto(f"{base}/accounting/institutions/{institution}/billing/")
        page.wait_for_timeout(800)
        page.screenshot(path=out / "b3-billing.png", full_page=True)
        page.locator("table a[href*='/invoices/']").first.click()
        page.wait_for_load_state("networkidle")
        page.screenshot(path=out / "b4-invoice.png", full_page=True)
        browser.close()
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1360, "height": 900})
        _login(page, base, "ada")
        page.goto(f"{base}/jobs/")
        page.locator("table a[href*='/jobs/']").first.click()
        page.wait_for_timeout(1200)
        page.screenshot(path=out / "b5-job-cost.png", full_page=True)
        browser.close()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), *sys.argv[3:4])
