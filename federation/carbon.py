"""Carbon-intensity sources of a pool: the admin's CSV schedule and the provider APIs.

This is the boundary to the providers (one module per outside system): nothing outside it sees
HTTP. ``forecast(provider, zone, …)`` returns ``[(aware datetime, gCO2e/kWh), …]`` sorted by time,
or raises ``CarbonError``.

- Electricity Maps, ``GET {base}/v3/carbon-intensity/forecast?zone=Z`` with header ``auth-token``;
  answer ``{"zone": Z, "forecast": [{"carbonIntensity": g/kWh, "datetime": ISO 8601}, …]}``.
- WattTime v3, ``GET {base}/v3/forecast?region=R&signal_type=co2_moer`` with a bearer token;
  answer ``{"data": [{"point_time": ISO 8601, "value": v}, …], "meta": {"units": U}}`` where
  ``U`` is ``lbs_co2_per_mwh`` (× 0.453592 → g/kWh) or ``g_co2_per_kwh``.

Base URLs and tokens come from settings (``FRP_CARBON_<PROVIDER>_URL`` / ``…_TOKEN``); nothing
here reaches the internet in tests, which replay recorded answers from a loopback server.
"""

from __future__ import annotations

import csv
import io
import json
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime

LBS_PER_MWH_TO_G_PER_KWH = 0.453592  # 453.592 g per lb ÷ 1000 kWh per MWh
MAX_CSV_ROWS = 50_000


class CarbonError(Exception):
    """A carbon-intensity source could not be read (bad file, provider error or answer)."""


def _aware(text: str, where: str) -> datetime:
    try:
        at = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise CarbonError(f"{where}: {text!r} is not an ISO 8601 date and time") from None
    if at.tzinfo is None:
        raise CarbonError(f"{where}: {text!r} has no UTC offset (write e.g. +00:00 or Z)")
    return at


def parse_csv(data: bytes) -> list[tuple[datetime, float]]:
    """Readings from an uploaded CSV (header ``datetime,g_per_kwh``), sorted by time.

    Raises ``CarbonError`` naming the first bad line: not UTF-8, missing columns, a time
    without offset, a negative or non-numeric intensity, a time twice, more than
    ``MAX_CSV_ROWS`` rows.
    """
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise CarbonError("the file is not UTF-8 text") from None
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames or not {"datetime", "g_per_kwh"} <= {
        f.strip() for f in reader.fieldnames
    }:
        raise CarbonError("the header must name the columns datetime and g_per_kwh")
    out: dict[datetime, float] = {}
    for n, row in enumerate(reader, start=2):
        row = {k.strip(): (v or "") for k, v in row.items() if k}
        at = _aware(row["datetime"], f"line {n}")
        try:
            value = float(row["g_per_kwh"])
        except ValueError:
            raise CarbonError(f"line {n}: {row['g_per_kwh']!r} is not a number") from None
        if value < 0 or value != value:
            raise CarbonError(f"line {n}: intensity must be zero or more")
        if at in out:
            raise CarbonError(f"line {n}: {row['datetime']} appears twice")
        out[at] = value
        if len(out) > MAX_CSV_ROWS:
            raise CarbonError(f"more than {MAX_CSV_ROWS} rows")
    if not out:
        raise CarbonError("the file has no readings")
    return sorted(out.items())


def _get(url: str, headers: dict[str, str], timeout: float) -> dict:
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 (https from settings)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            return json.loads(response.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        raise CarbonError(f"the provider answered HTTP {exc.code}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise CarbonError(f"the provider could not be reached: {exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CarbonError("the provider's answer is not JSON") from None


def forecast(
    provider: str, zone: str, *, base_url: str, token: str, timeout: float = 10.0
) -> list[tuple[datetime, float]]:
    """The provider's intensity forecast for ``zone`` (module docstring), sorted by time."""
    base = base_url.rstrip("/")
    if provider == "electricitymaps":
        body = _get(
            f"{base}/v3/carbon-intensity/forecast?" + urllib.parse.urlencode({"zone": zone}),
            {"auth-token": token},
            timeout,
        )
        try:
            points = [
                (_aware(p["datetime"], "forecast"), float(p["carbonIntensity"]))
                for p in body["forecast"]
            ]
        except (KeyError, TypeError, ValueError):
            raise CarbonError("unexpected Electricity Maps answer") from None
    elif provider == "watttime":
        body = _get(
            f"{base}/v3/forecast?"
            + urllib.parse.urlencode({"region": zone, "signal_type": "co2_moer"}),
            {"Authorization": f"Bearer {token}"},
            timeout,
        )
        try:
            units = body.get("meta", {}).get("units", "lbs_co2_per_mwh")
            factor = {"lbs_co2_per_mwh": LBS_PER_MWH_TO_G_PER_KWH, "g_co2_per_kwh": 1.0}[units]
            points = [
                (_aware(p["point_time"], "forecast"), float(p["value"]) * factor)
                for p in body["data"]
            ]
        except (KeyError, TypeError, ValueError, AttributeError):
            raise CarbonError("unexpected WattTime answer") from None
    else:
        raise CarbonError(f"unknown provider {provider!r}")
    if any(v < 0 for _, v in points):
        raise CarbonError("the provider returned a negative intensity")
    return sorted(points)
