"""Where a benchmark run's time went (kernels.bench.breakdown), from measuring journals."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from kernels.bench import breakdown

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
    folder = tmp_path / "env" / "abc" / breakdown.MEASUREMENTS / "c0ffee-1"
    folder.mkdir(parents=True)
    old, new = folder / "old.jsonl", folder / "new.jsonl"
    for path in (old, new):
        path.write_text(json.dumps(WORKER) + "\n" + json.dumps(_done("k", 5, compile=1.0))
                        + '\n{"event": "done", "key": "cut sh')  # a line a killed writer left
    os.utime(old, (1000, 1000))
    found = breakdown.journals(tmp_path / "env", since=2000)
    assert found == [new]
    assert breakdown.read(found).measured == 1
    assert [e["event"] for e in breakdown.entries(new)] == ["worker", "done"]
