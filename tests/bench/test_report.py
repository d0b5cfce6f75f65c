"""bench/run-compare's report: ratios from medians of the same run, and the targets judged
from them (a target table that said "met" wrongly would be worse than none)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from berthbench import report  # noqa: E402
from berthbench.util import summary  # noqa: E402


def res(*samples, failures=0):
    return {"summary": summary(list(samples)), "samples_ms": list(samples),
            "failures": failures, "errors": ["boom"] * failures}


def results(workloads, memory=None, fresh=None):
    peers = {n: {"label": n, "version": "1"} for n in
             ("crun", "bwrap", "berth", "berth-cxx", "host")}
    return {"mode": "quick", "peers": peers, "skipped_peers": {"docker": "not installed"},
            "machine": {"cpu": "cpu", "cores": 2, "memory_gib": 1, "kernel": "k", "os": "12",
                        "cgroups": "v1", "date": "d"},
            "workloads": workloads, "memory": memory or {},
            "berthd_fresh_rss_kib": fresh or {}}


def target_line(text, start):
    return next(line for line in text.splitlines() if line.startswith(f"| {start}"))


def test_ratio_is_berth_median_over_peer_median():
    text = report.markdown(results({"cold": {
        "crun": res(10, 30, 20), "berth": res(9, 12, 11), "berth-cxx": res(4, 5, 6)}}))
    line = target_line(text, "cold ≤ 0.5× crun")
    assert "0.55× (11.0 ms) MISSED" in line  # 11 / 20
    assert "0.25× (5.0 ms) met" in line       # 5 / 20
    assert "| crun | 20.0 [10.0–30.0] | 3 | 0 | 0.55× | 0.25× |" in text


def test_absolute_limit_and_failures_count():
    text = report.markdown(results({
        "trial": {"bwrap": res(100), "berth": res(35), "berth-cxx": res(25)},
        "trials_16_at_once": {"bwrap": res(1000), "berth": res(500, failures=1),
                              "berth-cxx": res(500)}}))
    trial = target_line(text, "trial ≤ 0.4× bwrap")
    assert "0.35× (35.0 ms) MISSED" in trial  # ratio met, over 30 ms
    assert "0.25× (25.0 ms) met" in trial
    par = target_line(text, "trials 16 at once")
    assert "0.50×, 1 failures MISSED" in par and "0.50×, 0 failures met" in par
    assert report.failure_count(results({"x": {"berth": res(1, failures=2)}})) == 2
    assert "- berth: boom" in text


def test_idle_rss_uses_the_larger_of_fresh_and_after_the_run():
    mem = {"berth": {"containers": 4, "failures": 0, "errors": [],
                     "host_memory_per_container_kib": 100, "disk_per_container_bytes": 0,
                     "daemon_rss_idle_kib": {"berthd": 11 * 1024},
                     "daemon_rss_loaded_kib": {"berthd": 12 * 1024}}}
    text = report.markdown(results({}, memory=mem, fresh={"berthd": 5 * 1024}))
    assert "5.0 MiB; 11.0 MiB MISSED" in target_line(text, "berthd idle RSS")
    assert "| docker | skipped: not installed |" in text


def test_missing_berth_figures_are_dashes_not_ratios():
    text = report.markdown(results({"exec_true": {"crun": res(20), "berth": res(5)}}))
    assert "0.25× (5.0 ms) MISSED | – |" in target_line(text, "exec_true ≤ 0.2× crun")
