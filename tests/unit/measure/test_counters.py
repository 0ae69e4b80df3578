"""perf stat's far/near DRAM counts: parsing saved outputs, the per-trial sums, the wrapper."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from multicard.measure import counters
from tests.helpers import ROOT

PERF = ROOT / "tests" / "fixtures" / "perf"
AMD = counters.EVENTS["AuthenticAMD"]


def test_the_cpu_vendor_is_read_from_cpuinfo() -> None:
    assert counters.vendor("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n") == "AuthenticAMD"
    assert counters.vendor("processor : 0\n") is None


def test_saved_perf_outputs_parse_with_what_perf_could_not_count() -> None:
    assert counters.parse_perf_csv((PERF / "amd_zen_fills.csv").read_text()) == {
        AMD[0]: 412395113, AMD[1]: 1630017222}
    intel = counters.parse_perf_csv((PERF / "intel_dram_multiplexed.csv").read_text())
    assert intel == dict(zip(counters.EVENTS["GenuineIntel"], (2011234, 9876543), strict=True))
    not_counted = counters.parse_perf_csv((PERF / "amd_not_counted.csv").read_text())
    assert not_counted == {AMD[0]: None, AMD[1]: 15023}
    # this VM: no PMU, so perf says <not supported> even for cycles
    vm = counters.parse_perf_csv((PERF / "vm_not_supported.csv").read_text())
    assert vm == {"cycles": None, "instructions": None, "task-clock": 1}


def test_a_rank_without_one_of_its_counts_says_which() -> None:
    assert counters.rank_counts({AMD[0]: 3, AMD[1]: 5}, AMD) == ((3, 5), None)
    assert counters.rank_counts({AMD[0]: None, AMD[1]: 5}, AMD) == (
        None, f"{AMD[0]}: <not supported> or <not counted> by this CPU, VM or kernel")
    assert counters.rank_counts({AMD[1]: 5}, AMD) == (None, f"perf printed no count of {AMD[0]}")


def perf_dir(tmp_path: Path, ranks: dict[int, str]) -> Path:
    """rank -> a saved perf output (file name under fixtures/perf), or `reason:...`."""
    tmp_path.mkdir()
    for rank, what in ranks.items():
        if what.startswith("reason:"):
            (tmp_path / f"rank{rank}.json").write_text(json.dumps({"reason": what.removeprefix("reason:")}))
            continue
        shutil.copy(PERF / what, tmp_path / f"rank{rank}.csv")
        (tmp_path / f"rank{rank}.events.json").write_text(json.dumps(list(AMD)))
    return tmp_path


def test_a_trial_sums_its_ranks_and_names_the_first_without_counts(tmp_path: Path) -> None:
    both = perf_dir(tmp_path / "a", {0: "amd_zen_fills.csv", 1: "amd_zen_fills.csv"})
    metrics, why = counters.trial_metrics(both, 2)
    assert metrics == {"far_dram_count": 2 * 412395113, "near_dram_count": 2 * 1630017222,
                       "far_dram_fraction": pytest.approx(412395113 / (412395113 + 1630017222))}
    assert why == {}
    part = perf_dir(tmp_path / "b", {0: "amd_zen_fills.csv", 1: "reason:perf is not installed"})
    metrics, why = counters.trial_metrics(part, 2)
    assert set(metrics.values()) == {None} and why["far_dram_fraction"] == "rank 1: perf is not installed"
    metrics, why = counters.trial_metrics(part, 3)  # rank 2 never wrote anything
    assert why["far_dram_count"] == "rank 1: perf is not installed"


def test_perf_refusing_the_events_is_a_reason_not_a_failed_trial() -> None:
    refused = (PERF / "vm_unknown_event.stderr").read_text()
    counted = (PERF / "amd_zen_fills.csv").read_text()
    assert counters.probe_verdict(AMD, 129, refused) == (
        None, f"perf stat cannot count {', '.join(AMD)} here: event syntax "
        "error: 'ls_dmnd_fills_from_sys.dram_io_far,ls_dmnd_fills_from_sy..'")
    assert counters.probe_verdict(AMD, 0, counted) == (AMD, None)
    unsupported = (PERF / "vm_not_supported.csv").read_text()
    assert counters.probe_verdict(AMD, 0, unsupported)[0] is None


def test_user_only_and_hybrid_pmu_names_are_the_events_asked_for() -> None:
    # perf under perf_event_paranoid 2 counts user space only and says so with `:u`; a hybrid
    # Intel CPU prints one line per core type, `cpu_core/EVENT/` and `cpu_atom/EVENT/`
    user_only = "\n".join(f"{n},,{e}:u,1000,100.00,," for n, e in zip((5, 7), AMD, strict=True))
    assert counters.rank_counts(counters.parse_perf_csv(user_only), AMD) == ((5, 7), None)
    remote, local = counters.EVENTS["GenuineIntel"]
    hybrid = (f"10,,cpu_core/{remote}/,100,100.00,,\n2,,cpu_atom/{remote}/,100,100.00,,\n"
              f"40,,cpu_core/{local}/,100,100.00,,\n<not supported>,,cpu_atom/{local}/,0,100.00,,\n")
    assert counters.rank_counts(counters.parse_perf_csv(hybrid), (remote, local)) == ((12, 40), None)
    assert counters.event_name("cycles") == "cycles"


def test_a_rank_whose_event_list_is_missing_says_so(tmp_path: Path) -> None:
    (tmp_path / "rank0.csv").write_text((PERF / "amd_zen_fills.csv").read_text())
    metrics, why = counters.trial_metrics(tmp_path, 1)
    assert metrics["far_dram_count"] is None
    assert "list of counted events is unreadable" in why["far_dram_count"]


def test_the_wrapper_runs_the_rank_and_says_why_it_counted_nothing_here(tmp_path: Path) -> None:
    events, why = counters.usable_events()
    if events is not None:
        pytest.skip("this machine's CPU offers the counters: nothing to explain")
    if shutil.which("perf") is None:
        assert why == "perf is not installed"
    ran = subprocess.run([sys.executable, "-m", "multicard.measure.counters", str(tmp_path), "--",
                          sys.executable, "-c", "print('the rank ran')"], capture_output=True, text=True,
                         env={**os.environ, "RANK": "3"}, check=True)
    assert ran.stdout == "the rank ran\n"
    assert json.loads((tmp_path / "rank3.json").read_text()) == {"reason": why}


def test_perf_is_told_to_start_disabled_where_it_can_be_controlled() -> None:
    argv = counters.perf_argv(AMD, Path("r0.csv"), (5, 6), ["python", "rank.py"])
    assert argv == ["perf", "stat", "-x", ",", "-e", ",".join(AMD), "--delay=-1", "--control=fd:5,6",
                    "-o", "r0.csv", "--", "python", "rank.py"]
    assert "--control=fd:5,6" not in counters.perf_argv(AMD, Path("r0.csv"), None, ["x"])


def test_how_the_counts_were_taken_is_recorded_user_space_only_included(tmp_path: Path) -> None:
    counted = (PERF / "amd_zen_fills.csv").read_text()
    assert not counters.user_only(counted)
    user = "\n".join(f"{n},,{e}:u,1000,100.00,," for n, e in zip((5, 7), AMD, strict=True))
    assert counters.user_only(user)
    assert counters.user_only("10,,cpu_core/mem_load_l3_miss_retired.remote_dram/u,100,100.00,,")
    (tmp_path / "rank0.csv").write_text(user)
    (tmp_path / "rank0.how.json").write_text(json.dumps({"window": "the timed epochs"}))
    assert counters.how_counted(tmp_path, 1) == ("perf stat over the timed epochs, user space only "
                                                 "(perf fell back to EVENT:u)")
    assert counters.how_counted(tmp_path, 2) is None  # rank 1 has no counts


@pytest.mark.skipif(shutil.which("perf") is None or not counters.has_control(),
                    reason="no perf with --control here")
def test_the_window_counts_the_timed_part_only_with_a_real_perf(tmp_path: Path) -> None:
    rank = ("import time\nfrom multicard.measure import counters\n"
            "def busy(s):\n    t = time.process_time()\n    while time.process_time() - t < s: pass\n"
            "busy(0.4)  # imports and warm-up: not counted\n"
            "with counters.Window() as w:\n    w.mark_start()\n    busy(0.3)\n"
            "busy(0.4)  # evaluation: not counted\n")
    # what counters.main execs, with an event any perf counts (a VM has no DRAM fill events)
    argv, fds, env = counters.prepare(tmp_path, "0", ["task-clock"], True, [sys.executable, "-c", rank])
    done = subprocess.run(argv, pass_fds=fds, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    line = next(x for x in (tmp_path / "rank0.csv").read_text().splitlines() if "task-clock" in x)
    counted_ms = float(line.split(",")[0])
    assert 250 < counted_ms < 650, line  # the 0.3 s window, not the 1.1 s the process ran
    # pipes, not FIFOs: the trial directory holds no special file for `verify` to refuse
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.csv", "rank0.events.json", "rank0.how.json"]
    assert json.loads((tmp_path / "rank0.how.json").read_text()) == {"window": "the timed epochs"}


def test_a_window_perf_never_acknowledged_nulls_the_ranks_counts_with_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, fds, env = counters.prepare(tmp_path, "0", ("a", "b"), True, ["true"])
    (tmp_path / "rank0.csv").write_text("100,,a,1,100.00,,\n50,,b,1,100.00,,\n")  # what perf wrote
    monkeypatch.setattr(counters.Window, "ACK_TIMEOUT_S", 0.01)
    with counters.Window(env) as window:  # no perf at the other ends of the pipes: no "ack"
        window.mark_start()
    for fd in fds:
        os.close(fd)
    assert window.error == "perf did not acknowledge 'enable' within 0.01 s"
    metrics, why = counters.trial_metrics(tmp_path, 1)
    assert metrics["far_dram_count"] is None
    assert why["far_dram_count"] == "rank 0: perf did not acknowledge 'enable' within 0.01 s"
