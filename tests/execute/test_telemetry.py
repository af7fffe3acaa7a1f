"""The sampler's summary of the GPU's state per phase (clocks, temperature, power, throttle reasons),
from a series as the sampler records it, and its way into the record's metrics. (The NVML queries
themselves run on a GPU host: tests/execute/test_gpu.py.)"""

from __future__ import annotations

from bench.execute.launch import telemetry
from bench.execute.launch.telemetry import Series, summarize


def _series() -> Series:
    s = Series()
    for i in range(6):  # one GPU; samples at t = 0..5, each also a slow (NVML state) sample
        s.t.append(float(i))
        s.rss.append(100 + i)
        s.gpu_used.append([1000])
        s.gpu_proc.append([900])
        s.slow_t.append(float(i))
        s.util.append([90])
        s.power_w.append([300.0 + 10 * i])
        s.energy_j.append([100.0 * i])
        s.sm_clock.append([1980 if i < 4 else 1500])
        s.mem_clock.append([2619])
        s.temperature.append([40 + i])
        # Idle before the steps, then a power cap, then hardware thermal slowdown at the end.
        s.throttle.append([0x1 if i < 2 else 0x4 if i < 5 else 0x40])
    return s


def test_gpu_state_per_phase():
    out = summarize(_series(), [("setup", 0.0), ("measured", 2.0)], end_t=6.0)
    setup, measured = out["phases"]["setup"], out["phases"]["measured"]
    assert setup["throttle_reasons"] == [], "idle is a state, not a slowdown"
    assert measured["throttle_reasons"] == ["sw_power_cap", "hw_thermal_slowdown"]
    assert measured["sm_clock_min_mhz"] == 1500 and measured["sm_clock_mean_mhz"] == (1980 * 2 + 1500 * 2) / 4
    assert (measured["temperature_max_c"], measured["power_max_w"], measured["mem_clock_mean_mhz"]) == (45, 350.0, 2619)


def test_unanswered_queries_leave_the_figures_out():
    s = _series()
    s.sm_clock = [[None]] * 6
    s.throttle = [[None]] * 6
    m = summarize(s, [("measured", 0.0)], end_t=6.0)["phases"]["measured"]
    assert "sm_clock_mean_mhz" not in m and "throttle_reasons" not in m and m["temperature_max_c"] == 45


def test_throttle_names():
    assert telemetry.throttle_names(0x1 | 0x2 | 0x8 | 0x100) == ["hw_slowdown", "display_clock_setting"]
    assert telemetry.throttle_names(0) == []


def test_gpu_state_reaches_the_record():
    from bench.records.record import Record
    from tests.records.test_record import _outcome, _started

    tel = {
        "nvml": True,
        "all": {"host_rss_peak_bytes": 5},
        "phases": {"measured": summarize(_series(), [("measured", 2.0)], 6.0)["phases"]["measured"]},
    }
    d = Record.from_outcome(_started(), _outcome(telemetry=tel), ds_config=None, log="l", ended_at="t").to_dict()
    m = d["metrics"]
    assert m["throttle_reasons"] == ["sw_power_cap", "hw_thermal_slowdown"] and m["sm_clock_min_mhz"] == 1500
    cpu = Record.from_outcome(_started(), _outcome(), ds_config=None, log="l", ended_at="t").to_dict()
    assert "sm_clock_mean_mhz" not in cpu["metrics"], "no NVML (a CPU host): the figures are absent, None in the table"
