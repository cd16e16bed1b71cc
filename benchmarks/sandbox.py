"""Sandbox ingest and load throughput against raw AES-256-GCM, and the ingest's peak memory.

Run from the repository root (a few minutes for the default 1 GiB on a 2-CPU machine)::

    .venv/bin/python benchmarks/sandbox.py [--size-mb 1024] [--tmp DIR] [--keep]

Steps, all on one generated file:

1. **Generate** a CSV of ``--size-mb`` MiB (default 1024) in a temporary directory, streaming
   (one block of rows in memory): 16 columns — integers (``id``, ``age``, ``sbp``, ``label``),
   floats (``bmi`` and six 5-decimal features), text (``sex``, ``region``, ``note_code``), a
   boolean (``smoker``) and an ISO date (``visit_date``); seeded, so the same size gives the
   same file. It stays in the page cache, so the figures below are CPU-bound.
2. **(a) Baseline**: single-core AES-256-GCM with ``cryptography`` (``AESGCM.encrypt``) on
   1 MiB chunks with 12-byte nonces and 32 bytes of associated data, best of 3 runs of about
   1 s each, MB/s (10^6 bytes per second of plaintext). Measured again after the ingest, so
   drift shows.
3. **(d) Peak RSS of the ingest**: ``sandbox.ingest.ingest_csv`` in a child process (``python
   benchmarks/sandbox.py --child ingest``); the peak is the child's ``VmHWM`` from
   ``/proc/self/status`` and, as a cross-check, its ``ru_maxrss`` from ``os.wait4`` (kernel
   accounting of that one child). The child's peak right after its imports is shown too.
   Target ≤ 100 MiB.
4. **(b) Ingest throughput** in this process: ``ingest_csv`` on the file into a filesystem
   store (validate, type and profile every cell, write the canonical payload, encrypt, fsync,
   store atomically), MB of CSV per second, as a ratio to (a). Target ≥ 0.8. For scale, the
   table also shows the ``csv`` module alone (``csv.reader`` over the file, rows discarded):
   what merely splitting records costs in CPython.
   The table also shows Arrow's CSV parser alone on the same blocks (``pyarrow.csv.read_csv``
   per 1 MiB block, the column types the native path asks for): the ceiling of the native
   path, which adds decoding, profiling, SHA-256 of source and ciphertext, and encryption.
5. **(c) Load**: decryption only (``crypto.decrypt_stream`` over the stored object, chunks
   discarded) and ``sandbox.loader.load_table`` for a training job's columns
   (``training_columns("label")``: the target and every numeric feature, 11 of 16 columns;
   decrypt chunk by chunk, parse into preallocated numpy arrays), MB of CSV per second as
   ratios to (a); then, for information, ``load_table`` of all 16 columns. The job load's peak
   RSS (child process, as in 3) is shown with the size of the arrays it returns.

The temporary directory is removed at the end unless ``--keep`` is given.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: E402

from sandbox.crypto import associated_data, decrypt_stream, generate_key  # noqa: E402
from sandbox.ingest import ingest_csv  # noqa: E402
from sandbox.loader import load_table, training_columns  # noqa: E402
from sandbox.storage import FilesystemStore  # noqa: E402

MIB = 1 << 20
CHUNK = MIB
SITE, DATASET = "bench-site", "bench"
KEK_ENV = "FRP_BENCH_KEK"
INGEST_TARGET = 0.8
RSS_TARGET_MIB = 100
JOB_COLUMNS = training_columns("label")  # what a training job on this file loads

HEADER = [
    "id",
    "age",
    "sex",
    "region",
    "visit_date",
    "bmi",
    "sbp",
    "x1",
    "x2",
    "x3",
    "x4",
    "x5",
    "x6",
    "smoker",
    "note_code",
    "label",
]
REGIONS = np.array(
    [
        "North East",
        "North West",
        "Yorkshire",
        "East Midlands",
        "West Midlands",
        "East",
        "London",
        "South East",
        "South West",
        "Wales",
        "Scotland",
        "Northern Ireland",
    ],
    dtype=object,
)


# --- data ---------------------------------------------------------------------------------------


def generate_csv(path: Path, size_bytes: int, *, seed: int = 20261129, block_rows: int = 20_000):
    """Write a CSV of at least ``size_bytes`` bytes (whole rows) to ``path``; return its rows."""
    rng = np.random.default_rng(seed)
    dates = np.array(
        [str(d) for d in np.arange("2015-01-01", "2025-01-01", dtype="datetime64[D]")],
        dtype=object,
    )
    codes = np.array([f"C{k:04d}" for k in range(500)], dtype=object)
    sexes = np.array(["F", "M", "X"], dtype=object)
    smoker = np.array(["false", "true"], dtype=object)
    written = 0
    rows = 0
    with open(path, "w", encoding="utf-8", newline="") as out:
        out.write(",".join(HEADER) + "\n")
        written += len(",".join(HEADER)) + 1
        while written < size_bytes:
            n = block_rows
            ids = np.arange(rows, rows + n)
            floats = rng.normal(0.0, 1.0, size=(6, n))
            columns = [
                map(str, ids.tolist()),
                map(str, rng.integers(18, 96, n).tolist()),
                sexes[rng.choice(3, n, p=[0.49, 0.49, 0.02])],
                REGIONS[rng.integers(0, len(REGIONS), n)],
                dates[rng.integers(0, len(dates), n)],
                map("{:.1f}".format, rng.normal(27.0, 4.5, n).tolist()),
                map(str, rng.integers(90, 200, n).tolist()),
                *(map("{:.5f}".format, row.tolist()) for row in floats),
                smoker[(rng.random(n) < 0.2).astype(int)],
                codes[rng.zipf(1.5, n) % len(codes)],
                map(str, rng.integers(0, 2, n).tolist()),
            ]
            block = "\n".join(map(",".join, zip(*columns, strict=True))) + "\n"
            out.write(block)
            written += len(block)  # ASCII: characters == bytes
            rows += n
    return rows


# --- measurements ---------------------------------------------------------------------------------


def aes_gcm_baseline(*, seconds: float = 1.0, repeats: int = 3) -> float:
    """Best single-core AES-256-GCM encryption rate over ``repeats`` runs, MB/s of plaintext."""
    aead = AESGCM(generate_key())
    chunk = os.urandom(CHUNK)
    aad = os.urandom(32)
    best = 0.0
    for _ in range(repeats):
        done = 0
        start = time.perf_counter()
        counter = 0
        while True:
            aead.encrypt(counter.to_bytes(12, "big"), chunk, aad)
            counter += 1
            done += CHUNK
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
        best = max(best, done / elapsed / 1e6)
    return best


def csv_module_rate(path: Path) -> float:
    """MB/s of ``csv.reader`` alone over ``path`` (rows discarded)."""
    size = path.stat().st_size
    start = time.perf_counter()
    with open(path, encoding="utf-8", newline="") as text:
        for _ in csv.reader(text):
            pass
    return size / (time.perf_counter() - start) / 1e6


def arrow_parse_rate(path: Path, schema: list[dict]) -> float | None:
    """MB/s of Arrow's CSV parser alone over ``path`` in 1 MiB blocks, with the column shapes
    the native ingest path asks for once the types are known; ``None`` without pyarrow."""
    from sandbox import arrowcsv

    if not arrowcsv.load():
        return None
    shapes = [c["type"] if c["type"] in ("int", "float") else "dict" for c in schema]
    size = path.stat().st_size
    start = time.perf_counter()
    with open(path, encoding="utf-8", newline="") as text:
        text.readline()
        while block := text.read(MIB):
            block += text.readline()
            arrowcsv.split_block(
                block, width=len(schema), delimiter=",", shapes=shapes, markers=("",)
            )
    return size / (time.perf_counter() - start) / 1e6


def decrypt_rate(store: FilesystemStore, key: str, kek: bytes, version: int, csv_bytes: int):
    """MB of CSV per second decrypting the stored object (chunks verified and discarded)."""
    aad = associated_data(site=SITE, dataset=DATASET, version=version)
    start = time.perf_counter()
    with store.open(key) as stream:
        for _ in decrypt_stream(kek=kek, aad=aad, source=stream):
            pass
    return csv_bytes / (time.perf_counter() - start) / 1e6


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def run_child(mode: str, csv_path: Path, store_dir: Path, version: int, kek: bytes) -> dict:
    """Run ``--child MODE`` in a fresh interpreter; return its JSON report plus ``ru_maxrss``."""
    report = store_dir.parent / f"child-{mode}-{version}.json"
    env = {**os.environ, KEK_ENV: kek.hex()}
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        mode,
        "--csv",
        str(csv_path),
        "--store",
        str(store_dir),
        "--version",
        str(version),
        "--report",
        str(report),
    ]
    proc = subprocess.Popen(command, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"child {mode} failed with exit code {proc.returncode}")
    out = json.loads(report.read_text())
    out["ru_maxrss_kib"] = usage.ru_maxrss  # Linux: KiB
    return out


def child_main(args: argparse.Namespace) -> None:
    """The measured child: ingest or load once, then report time and peak memory."""
    kek = bytes.fromhex(os.environ[KEK_ENV])
    store = FilesystemStore(Path(args.store))
    arrays = 0
    after_imports = _status_kib("VmHWM")
    start = time.perf_counter()
    if args.child == "ingest":
        ingest_csv(
            Path(args.csv),
            site=SITE,
            dataset=DATASET,
            version=args.version,
            store=store,
            kek=kek,
            tmp_dir=Path(args.store).parent,
        )
    else:
        key = f"{SITE}/{DATASET}/v{args.version}.csv.enc"
        table = load_table(
            store=store,
            kek=kek,
            store_key=key,
            site=SITE,
            dataset=DATASET,
            version=args.version,
            columns=JOB_COLUMNS,
        )
        arrays = sum(array.nbytes for array in table.data.values())
    seconds = time.perf_counter() - start
    Path(args.report).write_text(
        json.dumps(
            {
                "seconds": seconds,
                "vmhwm_kib": _status_kib("VmHWM"),
                "after_imports_kib": after_imports,
                "self_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                "arrays_bytes": arrays if args.child == "load" else 0,
            }
        )
    )


# --- main ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="CSV size in MiB (1024)")
    parser.add_argument("--tmp", type=Path, default=None, help="parent of the temp directory")
    parser.add_argument("--keep", action="store_true", help="keep the temp directory")
    parser.add_argument("--child", choices=["ingest", "load"], help=argparse.SUPPRESS)
    parser.add_argument("--csv", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--version", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--report", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_main(args)
        return 0

    work = Path(tempfile.mkdtemp(prefix="frp-bench-sandbox-", dir=args.tmp))
    try:
        return _run(args, work)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _run(args: argparse.Namespace, work: Path) -> int:
    csv_path = work / "bench.csv"
    store_dir = work / "store"
    store = FilesystemStore(store_dir)
    kek = generate_key()

    print(f"generating {args.size_mb} MiB CSV in {work} …", flush=True)
    start = time.perf_counter()
    rows = generate_csv(csv_path, args.size_mb * MIB)
    size = csv_path.stat().st_size
    print(
        f"  {size / MIB:.0f} MiB, {rows:,} rows × {len(HEADER)} columns "
        f"in {time.perf_counter() - start:.0f} s",
        flush=True,
    )

    print("(a) AES-256-GCM baseline …", flush=True)
    aes_before = aes_gcm_baseline()

    print("(d) ingest peak RSS (child process) …", flush=True)
    child_ingest = run_child("ingest", csv_path, store_dir, 1, kek)
    store.delete(f"{SITE}/{DATASET}/v1.csv.enc")  # disk space: only version 2 is read back

    print("(b) ingest throughput (this process) …", flush=True)
    start = time.perf_counter()
    result = ingest_csv(
        csv_path, site=SITE, dataset=DATASET, version=2, store=store, kek=kek, tmp_dir=work
    )
    ingest_s = time.perf_counter() - start
    aes_after = aes_gcm_baseline()
    csv_only = csv_module_rate(csv_path)
    arrow_only = arrow_parse_rate(csv_path, result.schema)

    print("(c) load throughput …", flush=True)
    decrypt_mbs = decrypt_rate(store, result.store_key, kek, 2, size)
    child_load = run_child("load", csv_path, store_dir, 2, kek)  # before this process grows
    ids = {"store_key": result.store_key, "site": SITE, "dataset": DATASET, "version": 2}
    start = time.perf_counter()
    table = load_table(store=store, kek=kek, columns=JOB_COLUMNS, **ids)
    load_s = time.perf_counter() - start
    assert table.n_rows == rows == result.row_count
    del table
    start = time.perf_counter()
    table = load_table(store=store, kek=kek, **ids)
    load_all_s = time.perf_counter() - start
    assert len(table.columns) == len(HEADER)
    del table

    aes = (aes_before + aes_after) / 2
    ingest_mbs = size / ingest_s / 1e6
    load_mbs = size / load_s / 1e6
    load_all_mbs = size / load_all_s / 1e6
    child_ingest_mbs = size / child_ingest["seconds"] / 1e6
    peak_mib = max(child_ingest["vmhwm_kib"], child_ingest["ru_maxrss_kib"]) / 1024

    print()
    print(
        f"CSV: {size / MIB:.0f} MiB ({size / 1e6:,.0f} MB), {rows:,} rows, "
        f"{len(HEADER)} columns; schema: "
        + ", ".join(f"{c['name']}:{c['type']}" for c in result.schema)
    )
    print(
        f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, numpy {np.__version__}"
    )
    rows_out = [
        (
            "(a) AES-256-GCM encrypt, 1 MiB chunks, 1 core",
            aes,
            "baseline",
            f"before {aes_before:,.0f} / after {aes_after:,.0f}",
        ),
        (
            "(b) ingest_csv (this process)",
            ingest_mbs,
            f"{ingest_mbs / aes:.3f}×",
            f"{ingest_s:.1f} s; target ≥ {INGEST_TARGET}×",
        ),
        (
            "    ingest_csv (child, for memory)",
            child_ingest_mbs,
            f"{child_ingest_mbs / aes:.3f}×",
            f"{child_ingest['seconds']:.1f} s",
        ),
        (
            "    csv.reader alone, for scale (rows discarded)",
            csv_only,
            f"{csv_only / aes:.3f}×",
            "rows discarded",
        ),
        *(
            [
                (
                    "    Arrow CSV parser alone, for scale",
                    arrow_only,
                    f"{arrow_only / aes:.3f}×",
                    "1 MiB blocks, rows discarded",
                )
            ]
            if arrow_only
            else []
        ),
        (
            "(c) decrypt only (decrypt_stream)",
            decrypt_mbs,
            f"{decrypt_mbs / aes:.3f}×",
            f"{size / decrypt_mbs / 1e6:.1f} s",
        ),
        (
            "(c) load_table, job columns (decrypt + parse)",
            load_mbs,
            f"{load_mbs / aes:.3f}×",
            f"{load_s:.1f} s; target + numeric features",
        ),
        (
            "    load_table, all 16 columns (information)",
            load_all_mbs,
            f"{load_all_mbs / aes:.3f}×",
            f"{load_all_s:.1f} s",
        ),
    ]
    width = max(len(r[0]) for r in rows_out)
    print()
    print(f"{'measurement':<{width}}  {'MB/s':>9}  {'vs (a)':>8}  notes")
    print(f"{'-' * width}  {'-' * 9}  {'-' * 8}  {'-' * 30}")
    for name, rate, ratio, note in rows_out:
        print(f"{name:<{width}}  {rate:>9,.1f}  {ratio:>8}  {note}")
    print()
    print("(d) peak RSS, MiB (child processes)      VmHWM  ru_maxrss  after imports")
    for name, child in (("ingest", child_ingest), ("load, job columns", child_load)):
        print(
            f"    {name:<36} {child['vmhwm_kib'] / 1024:>6.1f}  "
            f"{child['ru_maxrss_kib'] / 1024:>9.1f}  {child['after_imports_kib'] / 1024:>13.1f}"
        )
    print(
        f"    the load returns {child_load['arrays_bytes'] / MIB:.1f} MiB of arrays "
        f"({rows:,} rows × 11 float64 columns); the rest is the interpreter, numpy, pyarrow "
        "and a few MiB of buffers"
    )
    ok_ingest = ingest_mbs / aes >= INGEST_TARGET
    ok_rss = peak_mib <= RSS_TARGET_MIB
    print()
    print(
        f"ingest ≥ {INGEST_TARGET}× AES-GCM: {'met' if ok_ingest else 'NOT met'} "
        f"({ingest_mbs / aes:.3f}×); ingest peak RSS ≤ {RSS_TARGET_MIB} MiB: "
        f"{'met' if ok_rss else 'NOT met'} ({peak_mib:.1f} MiB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
