"""Where a benchmark run's time went (kernels.bench.breakdown), from measuring journals."""

from __future__ import annotations

import json
import os
import pathlib
import time

import pytest

from kernels.bench import breakdown
from kernels.core import journals

WORKER = {"event": "worker", "process_s": 1.5, "backend_s": 2.5}


def _done(key: str, samples: int, **phases: float) -> dict:
    return {"event": "done", "key": key, "samples": [1e-3] * samples,
            "phases": {name: phases.get(name, 0.0) for name in breakdown.PHASES}}


def test_phases_are_summed_over_parameter_sets_and_workers():
    found = breakdown.Breakdown()
    found.add([WORKER, _done("a", 10, compile=3.0, sampling=0.5),
               {"event": "failed", "key": "b", "reason": "timed out"},
               {"event": "skipped", "key": "c", "reason": "needs a GPU"}, WORKER,
               _done("d", 30, compile=1.0, inputs=2.0, sampling=1.5)])
    assert (found.measured, found.failed, found.workers) == (2, 1, 2)
    assert found.seconds["compile"] == 4.0 and found.seconds["sampling"] == 2.0
    assert found.seconds["process"] == 3.0 and found.seconds["backend"] == 5.0
    assert found.accounted == pytest.approx(3.0 + 5.0 + 4.0 + 2.0 + 2.0)
    assert found.samples == [10, 30]


def test_compiling_ahead_counts_once_per_case_by_its_wall_time():
    """A case's JAX parameter sets compile together on threads: the journal's wall time for
    the batch is one phase of its own, beside each parameter set's first call."""
    found = breakdown.Breakdown()
    found.add([WORKER, {"event": "ahead", "keys": ["a", "b"], "threads": 2},
               {"event": "ahead-done", "seconds": 4.0}, _done("a", 10, compile=0.5),
               _done("b", 10, compile=0.5), {"event": "ahead-done", "seconds": 2.0},
               {"event": "ahead-failed", "reason": "x"},
               {"event": "ahead-done"}])  # a line without its time counts none
    assert found.seconds["ahead"] == 6.0 and found.seconds["compile"] == 1.0
    assert found.measured == 2 and found.failed == 0
    text = found.render(wall_s=20.0)
    row = next(line for line in text.splitlines() if line.startswith("JAX compiled ahead"))
    assert row.split()[-2:] == ["6.0", "30%"]
    asv_line = next(line for line in text.splitlines() if line.startswith("asv's own work"))
    assert asv_line.split()[-2:] == ["9.0", "45%"]  # 20 - (1.5 + 2.5 + 6.0 + 1.0)


def test_the_rest_of_the_wall_time_is_asvs_own_work():
    found = breakdown.Breakdown()
    found.add([WORKER, _done("a", 10, compile=6.0)])
    text = found.render(wall_s=20.0)
    asv_line = next(line for line in text.splitlines() if line.startswith("asv's own work"))
    assert asv_line.split()[-2:] == ["10.0", "50%"]  # 20 - (1.5 + 2.5 + 6.0)
    assert "compile and first call" in text
    assert text.splitlines()[-1].split()[-2:] == ["20.0", "100%"]
    assert "1 parameter sets measured, 0 failed, by 1 worker process(es)" in text


def test_only_the_journals_written_since_the_run_began_count(tmp_path: pathlib.Path):
    folder = tmp_path / "env" / "abc" / journals.MEASUREMENTS / "c0ffee-1"
    folder.mkdir(parents=True)
    old, new = folder / "old.jsonl", folder / "new.jsonl"
    for path in (old, new):
        path.write_text(json.dumps(WORKER) + "\n" + json.dumps(_done("k", 5, compile=1.0))
                        + '\n{"event": "done", "key": "cut sh')  # a line a killed writer left
    os.utime(old, (1000, 1000))
    found = journals.written_since(tmp_path / "env", since=2000)
    assert found == [new]
    assert breakdown.read(found).measured == 1
    assert [e["event"] for e in journals.entries(new)] == ["worker", "done"]


def _lines(text: str) -> dict[str, list[str]]:
    """The breakdown's table rows by their label: label -> [seconds, share]."""
    rows = {}
    for line in text.splitlines()[3:]:  # the head, the table's header and its rule
        words = line.split()
        rows[" ".join(words[:-2])] = words[-2:]
    return rows


def test_every_phase_shows_its_seconds_and_share_of_the_wall_time():
    found = breakdown.Breakdown()
    found.add([WORKER, _done("a", 10, inputs=1.0, compile=5.0, warmup=0.5, sampling=2.0,
                             memory=0.25, launch=1.25)])
    rows = _lines(found.render(wall_s=40.0))
    assert rows[breakdown.LABELS["process"]] == ["1.5", "4%"]
    assert rows[breakdown.LABELS["backend"]] == ["2.5", "6%"]
    assert rows[breakdown.LABELS["compile"]] == ["5.0", "12%"]
    assert rows[breakdown.LABELS["launch"]] == ["1.2", "3%"]
    assert len(rows) == 1 + 2 + len(breakdown.PHASES) + 1  # asv's, the worker's, phases, total
    head, columns = found.render(wall_s=40.0).splitlines()[:2]
    assert head.startswith("where the time went") and columns.split() == ["phase", "seconds",
                                                                         "share"]


def test_without_a_wall_time_the_total_is_what_the_journals_measured():
    found = breakdown.Breakdown()
    found.add([WORKER, _done("a", 10, compile=6.0)])
    text = found.render(wall_s=None)
    assert not any(line.startswith("asv's own work") for line in text.splitlines())
    assert text.splitlines()[-1].split() == ["total", "(measured)", "10.0", "100%"]
    assert _lines(text)[breakdown.LABELS["compile"]] == ["6.0", "60%"]
    assert found.render(wall_s=20.0).splitlines()[-1].split()[:2] == ["total", "(wall)"]


def test_asv_s_share_is_never_negative_when_the_journals_cover_more_than_the_wall_time():
    # journals from a run that overlapped this one's start: more time accounted than passed
    found = breakdown.Breakdown()
    found.add([WORKER, _done("a", 10, compile=6.0)])
    asv_line = next(line for line in found.render(wall_s=5.0).splitlines()
                    if line.startswith("asv's own work"))
    assert "a process per benchmark" in asv_line
    assert asv_line.split()[-2:] == ["0.0", "0%"]


def test_a_breakdown_of_nothing_measured_has_no_shares():
    found = breakdown.Breakdown()
    found.add([{"event": "worker", "process_s": 0.0, "backend_s": 0.0}])
    text = found.render(wall_s=None)
    assert _lines(text)[breakdown.LABELS["process"]] == ["0.0", "-"]
    assert text.splitlines()[0].endswith("by 1 worker process(es)")  # no samples to describe


def test_the_sample_counts_are_described_by_median_and_range():
    found = breakdown.Breakdown()
    found.add([_done("a", 10), _done("b", 30), _done("c", 20)])
    assert found.render(wall_s=None).splitlines()[0].endswith(
        "by 0 worker process(es), 20 samples each (median; 10-30)")


def test_journal_lines_without_timings_count_as_zero_seconds():
    """A journal of an older measuring.py (or a worker killed before it timed a phase)."""
    found = breakdown.Breakdown()
    found.add([{"event": "worker"}, {"event": "done", "key": "a", "samples": [1.0]},
               {"event": "done", "key": "b", "samples": [1.0], "phases": {"compile": 2.0}}])
    assert found.accounted == 2.0 and found.measured == 2 and found.workers == 1
    assert set(found.seconds) == {"process", "backend", *breakdown.PHASES}


def test_only_failed_records_count_as_failures():
    found = breakdown.Breakdown()
    found.add([WORKER, {"event": "start", "key": "a"}, {"event": "failed", "key": "a"},
               {"event": "skipped", "key": "b"}, {"event": "start", "key": "c"},
               {"event": "failed", "key": "c"}, _done("d", 10)])
    assert (found.failed, found.measured) == (2, 1)


def test_a_line_cut_short_mid_journal_costs_only_that_line(tmp_path: pathlib.Path):
    """A killed worker's half line, then its replacement's lines after it."""
    path = tmp_path / "j.jsonl"
    path.write_text(json.dumps(WORKER) + '\n{"event": "done", "key": "cut sh\n'
                    + json.dumps(WORKER) + "\n" + json.dumps(_done("k", 5)) + "\n")
    assert [e["event"] for e in journals.entries(path)] == ["worker", "worker", "done"]


def test_a_journal_written_the_instant_the_run_began_counts(tmp_path: pathlib.Path):
    folder = tmp_path / "abc" / journals.MEASUREMENTS / "c0ffee-1"
    folder.mkdir(parents=True)
    path = folder / "j.jsonl"
    path.write_text(json.dumps(WORKER) + "\n")
    os.utime(path, (2000, 2000))
    assert journals.written_since(tmp_path, since=2000) == [path]


def test_the_environments_folder_is_the_one_asv_conf_names(tmp_path, monkeypatch):
    project = journals.env_dir(pathlib.Path(__file__).resolve().parents[1] / "asv.conf.json")
    config = tmp_path / "asv.conf.json"
    config.write_text(json.dumps({"env_dir": "elsewhere/env"}))
    assert journals.env_dir(config) == pathlib.Path("elsewhere/env")
    # no env_dir, no config, or one asv could not read: the project's own folder
    config.write_text(json.dumps({"version": 1}))
    assert journals.env_dir(config) == project
    assert journals.env_dir(tmp_path / "missing.json") == project
    config.write_text("{not json")
    assert journals.env_dir(config) == project
    monkeypatch.chdir(tmp_path)
    config.write_text(json.dumps({"env_dir": "elsewhere/env"}))
    assert journals.env_dir() == pathlib.Path("elsewhere/env")  # the current folder's


def test_the_report_reads_the_journals_of_the_current_folders_asv(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "asv.conf.json").write_text(json.dumps({"env_dir": "envs"}))
    assert breakdown.report(since=0, wall_s=30.0) is None  # nothing measured: nothing said
    folder = tmp_path / "envs" / "abc" / journals.MEASUREMENTS / "c0ffee-1"
    folder.mkdir(parents=True)
    (folder / "j.jsonl").write_text(json.dumps(WORKER) + "\n"
                                    + json.dumps(_done("k", 5, compile=6.0)) + "\n")
    text = breakdown.report(since=0, wall_s=30.0)
    assert text.splitlines()[0].startswith("where the time went: 1 parameter sets measured")
    assert text.splitlines()[-1].split()[-3:] == ["(wall)", "30.0", "100%"]
    assert breakdown.report(since=time.time() + 60, wall_s=30.0) is None


def _table(text: str) -> dict[str, list[str]]:
    """The breakdown's rows by label: label -> its cells after the label."""
    rows = {}
    for line in text.splitlines()[3:]:
        label, _, cells = line.partition("  ")
        rows[label.strip()] = cells.split()
    return rows


def test_a_confirmations_rounds_are_a_column_of_their_own_and_its_share_is_said():
    """planted: counting every line as the first pass's -> fails this."""
    found = breakdown.Breakdown()
    found.add([WORKER, _done("a", 10, compile=3.0, sampling=0.5),
               {**WORKER, "pass": "confirm"},
               {**_done("a", 20, warmup=0.25, sampling=0.75), "pass": "confirm"},
               {**_done("a", 20, warmup=0.25, sampling=0.75), "pass": "confirm"}])
    assert (found.measured, found.rounds, found.samples) == (1, 2, [10])
    text = found.render(wall_s=20.0)
    head, columns = text.splitlines()[:2]
    assert columns.split() == ["phase", "first", "pass", "confirmation", "seconds", "share"]
    assert head == ("where the time went: 1 parameter sets measured, 0 failed, by 2 worker "
                    "process(es), 10 samples each (median; 10-10); confirmation: 2 round(s) of "
                    "one parameter set on one commit, 6.0 s (30%)")
    rows = _table(text)
    assert rows[breakdown.LABELS["sampling"]] == ["0.5", "1.5", "2.0", "10%"]
    assert rows[breakdown.LABELS["compile"]] == ["3.0", "0.0", "3.0", "15%"]  # first pass only
    assert rows[breakdown.OUTSIDE_ASV] == ["-", "-", "6.5", "32%"]  # no pass has it
    assert rows[breakdown.LABELS["process"]] == ["1.5", "1.5", "3.0", "15%"]
    assert rows["total (wall)"] == ["7.5", "6.0", "20.0", "100%"]
    # without any round: the table as it always was
    alone = breakdown.Breakdown()
    alone.add([WORKER, _done("a", 10, compile=3.0)])
    assert alone.render(wall_s=20.0).splitlines()[1].split() == ["phase", "seconds", "share"]


def test_a_measured_outside_share_and_the_workers_overlap_keep_the_sum_at_the_wall_time():
    found = breakdown.Breakdown()
    found.add([WORKER, WORKER, _done("a", 10, compile=3.0)])  # 1.5 + 2.5 twice, 3.0
    found.add_phase("discovery", "commits' files", 2.0)
    rows = _table(found.render(20.0, "the gate's own work", outside_s=1.0))
    assert rows["the gate's own work"] == ["1.0", "5%"]
    assert rows["commits' files"] == ["2.0", "10%"]
    # 20 = 1 + (8 + 3 + 2) + 6 more between the workers' phases
    assert rows[breakdown.BETWEEN] == ["6.0", "30%"]
    rows = _table(found.render(10.0, "the gate's own work", outside_s=1.0))
    assert rows[breakdown.OVERLAP] == ["-4.0", "-40%"]  # the two workers started at once
    assert breakdown.OVERLAP not in _table(found.render(14.0, "x", outside_s=1.0))


def test_compiles_ahead_and_added_phases_go_in_their_passs_column():
    found = breakdown.Breakdown()
    found.add([WORKER, _done("a", 10, sampling=1.0),
               {"event": "ahead-done", "seconds": 2.0, "pass": "confirm"},
               {**_done("a", 10, sampling=1.0), "pass": "confirm"}])
    found.add_phase("discovery", "commits' files", 0.5, "confirm")
    rows = _table(found.render(wall_s=10.0))
    assert rows[breakdown.LABELS["ahead"]] == ["0.0", "2.0", "2.0", "20%"]
    assert rows["commits' files"] == ["0.0", "0.5", "0.5", "5%"]


def test_confirmation_rounds_without_a_wall_time_or_seconds_have_no_share():
    found = breakdown.Breakdown()
    found.add([{**_done("a", 10), "pass": "confirm"}])
    assert found.render(wall_s=None).splitlines()[0].endswith(
        "; confirmation: 1 round(s) of one parameter set on one commit, 0.0 s")


@pytest.mark.parametrize(("wall", "row"), [
    (14.5, ["-", "-", "0.5", "3%"]),  # half a second between the phases: shown
    (14.04, None),  # under a tenth of a second: rounding, not a phase
])
def test_the_overlap_row_shows_only_a_tenth_of_a_second_or_more(wall, row):
    found = breakdown.Breakdown()
    found.add([WORKER, WORKER, _done("a", 10, compile=3.0),  # 13 s, 2 of them confirmation's
               {**_done("a", 10, sampling=2.0), "pass": "confirm"}])
    rows = _table(found.render(wall, "x", outside_s=1.0))  # 14 = 1 outside + 13 accounted
    found_row = rows.get(breakdown.BETWEEN)
    assert found_row == row and breakdown.OVERLAP not in rows


def test_the_report_reads_the_confirmations_journals_written_since_it_began(tmp_path,
                                                                           monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "asv.conf.json").write_text(json.dumps({"env_dir": "envs"}))
    rounds = tmp_path / "confirm" / "c0ffee" / "rounds"
    rounds.mkdir(parents=True)
    new, old = rounds / "softmax.jsonl", rounds / "matmul.jsonl"
    new.write_text(json.dumps({**_done("k", 5, sampling=4.0), "pass": "confirm"}) + "\n")
    old.write_text(json.dumps({**_done("k", 5, sampling=100.0), "pass": "confirm"}) + "\n")
    (rounds / "notes.txt").write_text("not a journal")
    os.utime(new, (2000, 2000))  # written the instant the run began: counts
    os.utime(old, (1999, 1999))
    text = breakdown.report(since=2000, wall_s=8.0, also=[tmp_path / "confirm"])
    assert text.splitlines()[0].endswith("one parameter set on one commit, 4.0 s (50%)")
    assert breakdown.report(since=2000, wall_s=8.0) is None  # asv's own journals: none
