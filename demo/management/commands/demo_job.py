"""``manage.py demo_job``: submit the demo job through the web form over HTTP, as a researcher would.

Signs in (CSRF token and all), fills the job form with every dataset the project may use, follows the
job page, prints progress until the job ends, then the federated test accuracy and a row per site.
Exit status: 0 when the job COMPLETED, 1 otherwise.
"""

from __future__ import annotations

import re
import sys
import time

import requests
from django.core.management.base import BaseCommand, CommandError

from demo.seed import DEMO_PASSWORD


def _csrf(html: str) -> str:
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    if not match:
        raise CommandError("no CSRF token on the page")
    return match.group(1)


class Command(BaseCommand):
    help = "Sign in as the demo researcher, submit a job by web form, and follow it to the end."

    def add_arguments(self, parser):
        parser.add_argument("--base-url", default="http://127.0.0.1:8000")
        parser.add_argument("--username", default="ada")
        parser.add_argument("--password", default=DEMO_PASSWORD)
        parser.add_argument("--rounds", type=int, default=5)
        parser.add_argument("--timeout", type=float, default=600.0, help="seconds")

    def handle(self, *args, base_url, username, password, rounds, timeout, **options):
        http = requests.Session()
        url = base_url.rstrip("/")
        page = http.get(f"{url}/accounts/login/", timeout=30)
        page.raise_for_status()
        r = http.post(
            f"{url}/accounts/login/",
            data={"login": username, "password": password, "csrfmiddlewaretoken": _csrf(page.text)},
            headers={"Referer": f"{url}/accounts/login/"},
            timeout=30,
        )
        if "sessionid" not in http.cookies:
            raise CommandError(f"sign-in as {username!r} failed (HTTP {r.status_code})")

        form = http.get(f"{url}/jobs/new/", timeout=30)
        form.raise_for_status()
        datasets = re.findall(r'name="datasets" value="(\d+)"', form.text)
        project = re.search(r'<option value="(\d+)"', form.text)
        if not datasets or not project:
            raise CommandError("the job form offers no project or dataset")
        started = time.monotonic()
        r = http.post(
            f"{url}/jobs/new/",
            data={
                "csrfmiddlewaretoken": _csrf(form.text),
                "title": "Breast-cancer diagnosis, 3 hospitals",
                "project": project.group(1),
                "datasets": datasets,
                "target_column": "diagnosis",
                "feature_columns": "",
                "num_rounds": rounds,
                "local_epochs": 5,
                "learning_rate": 0.1,
            },
            headers={"Referer": f"{url}/jobs/new/"},
            timeout=30,
        )
        match = re.search(r"/jobs/(\d+)/$", r.url)
        if not match:
            errors = re.findall(r'invalid-feedback d-block">([^<]+)<', r.text)
            raise CommandError(f"the form was refused: {errors or r.status_code}")
        job_id = int(match.group(1))
        self.stdout.write(f"Submitted job #{job_id} ({len(datasets)} sites): {r.url}")

        try:
            p = self._follow(http, url, job_id, started, timeout)
        except KeyboardInterrupt:
            self.stderr.write(
                f"\nInterrupted. Job #{job_id} keeps its state; the portal marks it when the "
                "federation reports its end (or fails it if the federation was stopped)."
            )
            sys.exit(130)
        if p["status"] == "completed":
            p = self._wait_accounting(http, url, job_id, p)
        self._report(p, job_id, started)

    def _follow(self, http, url: str, job_id: int, started: float, timeout: float) -> dict:
        """Print progress lines until the job is terminal; return the last progress JSON."""
        last, printed = None, started
        while True:
            p = http.get(f"{url}/jobs/{job_id}/progress.json", timeout=30).json()
            line = (
                f"[{time.monotonic() - started:6.1f} s] {p['status']:<9} "
                f"round {p['rounds_done']}/{p['num_rounds']}"
            )
            acc, loss = p["chart"]["eval_accuracy"], p["chart"]["eval_loss"]
            if acc and acc[-1] is not None:  # (None: not released to this viewer)
                line += f"  test accuracy {acc[-1]:.3f}"
            if loss and loss[-1] is not None:
                line += f"  test loss {loss[-1]:.4f}"
            # A line when something changed, and at least every 15 s while nothing does (a
            # round's sites may take a while on a loaded machine: no minutes of silence).
            if line.split("] ", 1)[1] != last or time.monotonic() - printed >= 15:
                self.stdout.write(line)
                last, printed = line.split("] ", 1)[1], time.monotonic()
            if p["terminal"]:
                return p
            if time.monotonic() - started > timeout:
                raise CommandError(f"job #{job_id} did not finish within {timeout:.0f} s")
            time.sleep(2)

    def _wait_accounting(self, http, url: str, job_id: int, p: dict, timeout: float = 60) -> dict:
        """After completion the worker writes contribution and bills; wait for them briefly."""
        deadline = time.monotonic() + timeout
        while not (p["accounting"]["shares"] and p["accounting"]["cost"]):
            if time.monotonic() > deadline:
                self.stderr.write("contribution and cost not written yet; see the job page")
                break
            time.sleep(2)
            p = http.get(f"{url}/jobs/{job_id}/progress.json", timeout=30).json()
        return p

    def _report(self, p: dict, job_id: int, started: float) -> None:
        elapsed = time.monotonic() - started
        self.stdout.write(
            f"\nJob #{job_id} {p['status'].upper()} in {elapsed:.1f} s: {p['status_detail']}"
        )
        final = p["final_metrics"]
        if final.get("eval_accuracy") is not None:
            self.stdout.write(
                f"Federated test accuracy: {final['eval_accuracy']:.4f} "
                f"on {final['eval_examples']} held-out examples"
            )
        baseline = final.get("baseline") or {}
        if baseline.get("value") is not None and baseline.get("model") is not None:
            verdict = "the model beats it" if baseline.get("better") else "NOT beaten"
            self.stdout.write(
                f"Baseline, {baseline.get('name')}: {baseline['value']:.4f} ({verdict})"
            )
        self.stdout.write(
            f"{'site':<12} {'institution':<34} {'status':<10} {'rounds':>6} "
            f"{'train rows':>10} {'test rows':>9} {'test accuracy':>13} {'Shapley share':>13}"
        )
        shares = p["accounting"]["shares"]
        for s in p["sites"]:
            acc = "—" if s["eval_accuracy"] is None else f"{s['eval_accuracy']:.3f}"
            share = f"{shares[s['site']]:.1%}" if s["site"] in shares else "—"
            self.stdout.write(
                f"{s['site']:<12} {s['institution']:<34} {s['status']:<10} {s['rounds_completed']:>6} "
                f"{s['train_examples']:>10} {s['eval_examples']:>9} {acc:>13} {share:>13}"
            )
            if s["error"]:
                self.stdout.write(f"    error: {s['error']}")
        cost = p["accounting"]["cost"]
        if cost:
            self.stdout.write(
                f"Cost: {cost['charged']} {cost['currency']} charged to {cost['payer']} "
                f"({cost['service_units']} service units); contribution, usage, cost and credit "
                f"are on the job page, every record in the ledger."
            )
        if p["status"] != "completed":
            sys.exit(1)
