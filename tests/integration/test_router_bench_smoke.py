"""Smoke run of bench/router_bench.py: every arm runs with zero errors. Nothing about speed (shared machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.router_bench import ARMS

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_router_bench_smoke(tmp_path):
    out = tmp_path / "router_bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.router_bench", "--smoke", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["benchmark"] == "router_bench" and report["smoke"] is True
    assert report["processes_exited_early"] == []
    concurrencies = report["config"]["concurrency"]
    max_tokens = report["config"]["max_tokens"]

    phases = report["phases"]
    assert sorted((p["concurrency"], p["arm"]) for p in phases) == sorted(
        (c, arm) for c in concurrencies for arm in ARMS
    )
    for phase in phases:
        assert phase["errors"] == 0, phase
        assert phase["requests"] > 0 and phase["ttft_ms"]["n"] > 0, phase
        # Tokens are counted as they arrive inside the window, so partial streams at its edges count too.
        assert phase["tokens"] >= phase["requests"] * max_tokens - phase["concurrency"] * max_tokens, phase

    for concurrency in concurrencies:
        rows = report["summary"][str(concurrency)]
        assert set(rows) == set(ARMS)
        for row in rows.values():
            assert row["errors"] == 0 and row["requests"] > 0
            for key in ("p50", "p99"):
                assert row["ttft_ms"][key] > 0
            for base in ("direct", "sglang-router"):
                assert set(row[f"vs_{base}"]) == {
                    "added_ttft_ms_p50",
                    "added_ttft_ms_p99",
                    "ttft_p50_ratio",
                    "ttft_p99_ratio",
                    "tokens_per_s_ratio",
                }
        assert rows["direct"]["vs_direct"]["tokens_per_s_ratio"] == 1.0
        for arm in ("bandmaster", "bandmaster-nosched", "bandmaster-2proc"):
            router = rows[arm]["router"]  # read from the arm's own router /metrics around each phase
            assert router["fail_open"] == 0 and router["loop_lag_samples"] > 0, (arm, router)
            assert 0 < router["loop_lag_p99_s"] <= float("inf")
    assert set(report["targets"]) == set()  # the smoke run has neither 64 nor 256 streams
    assert "tok/s" in done.stdout and "sglang-router" in done.stdout
