"""Helpers that run for minutes (the op build) report progress while they run: what, how long, the log
and its last line, at least every 30 s (here every half second, on a real helper process)."""

from __future__ import annotations

import os

from bench.execute import launch
from bench.host import heartbeat

HELPER = """import time
for i in range(4):
    print(f"[{i + 1}/4] compiling op_{i}.cpp", flush=True)
    time.sleep(0.5)
"""


def test_a_running_helper_reports_its_log_and_last_line(tmp_path):
    log = tmp_path / "prebuild.log"
    lines: list[str] = []
    ends = launch.run_tools(
        [(["-c", HELPER], log, dict(os.environ), 60)], heartbeat.printing(lines.append), every_s=0.4
    )
    assert ends[0][0] == 0
    assert len(lines) >= 2, lines
    assert all(ln.startswith("  still running prebuild: ") and f"log {log}" in ln for ln in lines), lines
    assert any("; last: [" in ln and "compiling op_" in ln for ln in lines), lines


def test_the_default_beat_is_within_30_seconds():
    assert 0 < heartbeat.EVERY_S <= 30


def test_last_line_reads_only_the_end_of_a_large_log(tmp_path):
    log = tmp_path / "big.log"
    log.write_bytes(b"x" * 10_000_000 + b"\n[40/40] Linking cpu_adam.so\n\n")
    assert heartbeat.last_line(log) == "[40/40] Linking cpu_adam.so"
    assert heartbeat.last_line(tmp_path / "none.log") == ""
