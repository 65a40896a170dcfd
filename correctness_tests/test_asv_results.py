"""asv_tools where it meets asv, git and the reader: results read from a real asv results folder
(one machine's, one commit's rows), the machine entry asv copies into every result, the asv
and git command lines run (asv's "some failed" status tolerated, the dashboard variable set
or cleared), the noise floors learned and stored beside the results, and the tables a reader
sees (plain text, the pull request's Markdown, the smallest change each row can call).

No asv benchmark runs here: subprocess, asv and the commit hashes are stood in for where
a real run would measure, and a small git repository is made where a real one is cheap.
Test names leave out the word "machine": the asv-verdicts mutation target deselects them."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Skip only when the third-party package is missing; an import error in our own
# kernels.bench.asv_tools must fail the module, never turn it into a skip.
if importlib.util.find_spec("asv") is None:
    pytest.skip("needs asv (pip install asv)", allow_module_level=True)

from correctness_tests import fakes  # noqa: E402
from kernels.bench import asv_tools  # noqa: E402

TIME = "benchmarks.Softmax.time_device"
GBPS = "benchmarks.Softmax.track_gbps"
BASE, HEAD = "a1" * 20, "b2" * 20  # two commits whose 8-character prefixes differ
# asv 0.6's result columns, in the order its Results.save writes them.
COLUMNS = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a",
           "stats_ci_99_b", "stats_q_25", "stats_q_75", "stats_number", "stats_repeat",
           "samples"]


def _entry(params: list[list[str]], values: list, started_at: float,
           samples: list | None = None, stats: list | None = None) -> list:
    """One benchmark's row of an asv 0.6 results file: per parameter combination a value,
    its samples and its stats (None where asv keeps none)."""
    def column(name):
        return None if stats is None else [s and s.get(name) for s in stats]

    return [values, params, "1", started_at, 1.0, column("ci_99_a"), column("ci_99_b"),
            column("q_25"), column("q_75"), column("number"), column("repeat"), samples]


def _results_folder(root: Path, machine: str, commit: str, rows: dict[str, list]) -> Path:
    """`rows` (benchmark -> `_entry`) as asv stores `commit`'s results for `machine`."""
    fakes.asv_result_file(root, machine, commit, rows, tuple(COLUMNS))
    return root


def _rows_of(table: str) -> list[dict[str, str]]:
    """The plain-text table (kernels.core.tables) as one dict per row, keyed by the header:
    its columns are padded apart by two or more spaces, its cells hold single spaces."""
    header, _rule, *body = table.splitlines()
    names = re.split(r" {2,}", header)
    return [dict(zip(names, re.split(r" {2,}", line), strict=True)) for line in body]


class _Stdout:
    """A stdout that knows what was printed but not yet flushed: asv's and git's output go
    straight to the terminal, so a line printed before they start must be flushed first or it
    lands after theirs."""

    def __init__(self):
        self.flushed, self.pending = "", ""

    def write(self, text: str) -> int:
        self.pending += text
        return len(text)

    def flush(self) -> None:
        self.flushed, self.pending = self.flushed + self.pending, ""


# -- load: asv's results folder ------------------------------------------------------------

def test_load_reads_one_commit_of_one_host_keyed_by_benchmark_and_parameters(tmp_path):
    stats = [{"ci_99_a": 0.9e-3, "ci_99_b": 1.1e-3, "q_25": 0.95e-3, "q_75": 1.05e-3,
              "number": 1, "repeat": 3}, None, None, {"number": 1, "repeat": 2}]
    params = [["'xla'", "'pallas'"], ["'fwd'", "'bwd'"]]
    # xla/fwd measured; xla/bwd skipped (asv writes NaN); pallas/fwd failed (null).
    timed = _entry(params, [1e-3, math.nan, None, 2e-3], 1700000000000,
                   samples=[[1e-3, 1.1e-3, 0.9e-3], None, None, [2e-3, 2.1e-3]], stats=stats)
    tracked = _entry([["'xla'"]], [123.5], 1700000000500)
    single = _entry([], [7.0], 1700000000900)
    root = _results_folder(tmp_path, "gpu-a", BASE, {TIME: timed, GBPS: tracked,
                                                     "benchmarks.Plain.track_size": single})
    # The same rows with other values: another commit here, and this commit elsewhere.
    _results_folder(root, "gpu-a", HEAD, {TIME: _entry(params, [5.0] * 4, 1)})
    _results_folder(root, "gpu-b", BASE, {TIME: _entry(params, [6.0] * 4, 2)})

    found = asv_tools.load(str(root), "gpu-a", BASE)
    assert set(found) == {(TIME, ("'xla'", "'fwd'")), (TIME, ("'xla'", "'bwd'")),
                          (TIME, ("'pallas'", "'fwd'")), (TIME, ("'pallas'", "'bwd'")),
                          (GBPS, ("'xla'",)), ("benchmarks.Plain.track_size", ())}
    assert found[(TIME, ("'xla'", "'fwd'"))] == asv_tools.Result(
        1e-3, [1e-3, 1.1e-3, 0.9e-3], stats[0], 1700000000000)
    assert found[(TIME, ("'pallas'", "'bwd'"))] == asv_tools.Result(
        2e-3, [2e-3, 2.1e-3], stats[3], 1700000000000)
    # A skipped (NaN) and a failed (null) combination both read as no value.
    assert found[(TIME, ("'xla'", "'bwd'"))].value is None
    assert found[(TIME, ("'pallas'", "'fwd'"))].value is None
    assert found[(GBPS, ("'xla'",))] == asv_tools.Result(123.5, None, None, 1700000000500)
    # An unparametrized benchmark is keyed by no parameters, its value a number (it read as
    # [7.0] once: load wrapped the one-element list asv already returns).
    assert found[("benchmarks.Plain.track_size", ())] == asv_tools.Result(
        7.0, None, None, 1700000000900)

    assert {r.value for r in asv_tools.load(str(root), "gpu-a", HEAD).values()} == {5.0}
    assert {r.value for r in asv_tools.load(str(root), "gpu-b", BASE).values()} == {6.0}
    assert asv_tools.load(str(root), "gpu-b", HEAD) == {}


# -- the machine entry: what asv copies into every result -----------------------------------

def _gpu(**changes):
    from kernels.core import fingerprint

    return dataclasses.replace(fingerprint.Identity(
        "gpu", "Test GPU 80GB", "test-gpu-80gb", "999.1", "99.9", 1234), **changes)


@pytest.fixture
def host(tmp_path, monkeypatch):
    """This host as register_machine reads it, made up: HOME (where asv keeps its machine
    file), the CPU, the OS, the core count and the memory; returns a setter for the device."""
    import os
    import platform

    from kernels.core import fingerprint

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(fingerprint, "_cpu_name", lambda: "Test CPU @ 1GHz")
    # A real uname_result, not a namespace: asv unpacks uname() as a tuple when it is
    # first imported, which may happen inside a test that this fixture set up.
    made_up = platform.uname_result("TestOS", "test-node", "9.9-test", "#1", "test-arch")
    monkeypatch.setattr(platform, "uname", lambda: made_up)
    monkeypatch.setattr(platform, "machine", lambda: "test-arch")
    monkeypatch.setattr(os, "cpu_count", lambda: 7)
    monkeypatch.setattr(os, "sysconf", {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 1000}.__getitem__)

    def device(identity):
        monkeypatch.setattr(fingerprint, "identity", lambda: identity)

    return device


def _entries(home: Path) -> dict:
    return json.loads((home / ".asv-machine.json").read_text())


def test_the_registered_gpu_entry_holds_the_host_and_device_keys(host, tmp_path, monkeypatch):
    host(_gpu())
    stdout = _Stdout()
    monkeypatch.setattr(sys, "stdout", stdout)
    assert asv_tools.register_machine() == "test-gpu-80gb"
    expected = {"machine": "test-gpu-80gb", "os": "TestOS 9.9-test", "arch": "test-arch",
                "cpu": "Test CPU @ 1GHz; Test GPU 80GB, driver 999.1, CUDA 99.9",
                "num_cpu": "7", "ram": str(4096 * 1000), "gpu": "Test GPU 80GB",
                "driver": "999.1", "cuda": "99.9", "sm_clock_mhz": "1234"}
    assert _entries(tmp_path) == {"test-gpu-80gb": expected, "version": 1}
    # Said, and flushed before asv (which writes to the terminal itself) starts.
    assert stdout.flushed == (f"asv machine 'test-gpu-80gb' written to "
                              f"{tmp_path / '.asv-machine.json'}\n") and not stdout.pending

    # Unchanged: the file is left alone and nothing is said.
    asv_tools.register_machine()
    assert stdout.flushed.count("written to") == 1
    # A new driver rewrites the entry.
    host(_gpu(driver="1000.0"))
    asv_tools.register_machine()
    newer = {**expected, "driver": "1000.0", "cpu": expected["cpu"].replace("999.1", "1000.0")}
    assert _entries(tmp_path)["test-gpu-80gb"] == newer
    assert stdout.flushed.count("written to") == 2
    # A name given names the entry, kept beside the others.
    assert asv_tools.register_machine("bench-box") == "bench-box"
    assert _entries(tmp_path) == {"test-gpu-80gb": newer, "version": 1,
                                  "bench-box": {**newer, "machine": "bench-box"}}


def test_a_cpu_only_host_registers_its_cpu_and_no_gpu_keys(host, tmp_path):
    from kernels.core import fingerprint

    cpu = fingerprint.Identity("cpu", "Test CPU @ 1GHz", "test-cpu-1ghz", None, None, None)
    host(cpu)
    assert asv_tools.register_machine() == "test-cpu-1ghz"
    entry = _entries(tmp_path)["test-cpu-1ghz"]
    assert entry["cpu"] == "Test CPU @ 1GHz"  # no "; <gpu>, driver ..." on a CPU host
    assert {key: entry[key] for key in ("gpu", "driver", "cuda", "sm_clock_mhz")} == {
        "gpu": "none", "driver": "n/a", "cuda": "n/a", "sm_clock_mhz": "n/a"}


def test_device_keys_name_the_gpu_only_on_the_gpu_platform():
    assert asv_tools.machine_keys(_gpu()) == {"gpu": "Test GPU 80GB", "driver": "999.1",
                                              "cuda": "99.9", "sm_clock_mhz": "1234"}
    # The platform alone decides whether a GPU is named; the other keys are read as they are.
    assert asv_tools.machine_keys(_gpu(platform="cpu")) == {
        "gpu": "none", "driver": "999.1", "cuda": "99.9", "sm_clock_mhz": "1234"}
    assert asv_tools.machine_keys(_gpu(driver=None, default_sm_mhz=None)) == {
        "gpu": "Test GPU 80GB", "driver": "n/a", "cuda": "99.9", "sm_clock_mhz": "n/a"}


def test_the_asv_name_leads_with_the_gpu_count_only_where_several_are_seen(host):
    assert asv_tools.machine_name(_gpu(devices=1)) == "test-gpu-80gb"
    assert asv_tools.machine_name(_gpu(devices=2)) == "2x-test-gpu-80gb"
    host(_gpu(devices=8))  # no device given: this process's own
    assert asv_tools.machine_name() == "8x-test-gpu-80gb"
    assert asv_tools.register_machine() == "8x-test-gpu-80gb"


# -- the asv and git command lines ----------------------------------------------------------

def _finishing(status: int, calls: list):
    def fake_run(command, *args, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, status)

    return fake_run


@pytest.mark.parametrize("status", [0, asv_tools.ASV_SOME_FAILED])
def test_asv_runs_in_this_python_and_some_failed_benchmarks_are_no_error(status, monkeypatch):
    """asv exits 2 when it ran everything and some benchmarks failed: their results are kept
    (as failed), and the compare says which; that is no reason to stop."""
    calls, stdout = [], _Stdout()
    monkeypatch.setattr(sys, "stdout", stdout)

    finishing = _finishing(status, calls)

    def fake_run(command, *args, **kwargs):
        assert not stdout.pending, "the command line must be flushed before asv writes"
        return finishing(command)

    monkeypatch.setattr(subprocess, "run", fake_run)
    asv_tools._asv("run", "--machine", "m")
    assert calls == [[sys.executable, "-m", "asv", "run", "--machine", "m"]]
    assert stdout.flushed == f"+ {sys.executable} -m asv run --machine m\n"


@pytest.mark.parametrize("status", [1, 3, 130])
def test_any_other_asv_exit_status_raises_with_the_command(status, monkeypatch):
    calls = []
    monkeypatch.setattr(subprocess, "run", _finishing(status, calls))
    with pytest.raises(subprocess.CalledProcessError) as raised:
        asv_tools._asv("run", "HEAD^!")
    assert raised.value.returncode == status
    assert raised.value.cmd == [sys.executable, "-m", "asv", "run", "HEAD^!"] == calls[0]


@pytest.fixture
def asv_run(monkeypatch):
    """bench's collaborators stood in for: the machine is "test-gpu", each revision's hash is
    its name repeated, and asv (`_asv`) records its arguments and the two variables the
    benchmarks read; returns (calls, kept lists, recovered machines)."""
    from kernels.bench import breakdown, listing, recover

    calls, kept, recovered = [], [], []
    monkeypatch.setattr(asv_tools, "register_machine", lambda: "test-gpu")
    monkeypatch.setattr(asv_tools, "full_hash", lambda revision: (revision * 40)[:40])
    # Set, then removed, so that monkeypatch restores the environment bench changes.
    for variable in (asv_tools.DASHBOARD_VARIABLE, breakdown.QUIET_VARIABLE):
        monkeypatch.setenv(variable, "before")
        monkeypatch.delenv(variable)

    def fake_asv(*args):
        import os

        calls.append((args, os.environ.get(asv_tools.DASHBOARD_VARIABLE),
                      os.environ.get(breakdown.QUIET_VARIABLE)))

    monkeypatch.setattr(asv_tools, "_asv", fake_asv)
    monkeypatch.setattr(listing, "keep_benchmark_list",
                        lambda *args: kept.append(args))
    monkeypatch.setattr(recover, "recover_all", lambda name: recovered.append(name))
    return calls, kept, recovered


def test_bench_runs_asv_on_each_commit_with_samples_kept_and_the_dashboard_metrics(asv_run):
    from kernels.bench import listing

    calls, kept, recovered = asv_run
    assert asv_tools.bench(["b", "h"], bench_regex="Softmax") == "test-gpu"
    run = ["run", "--machine", "test-gpu", "--show-stderr", "--record-samples"]
    assert calls == [((*run, "b" * 40 + "^!", "--bench", "Softmax"), "1", "1"),
                     ((*run, "h" * 40 + "^!", "--bench", "Softmax"), "1", "1")]
    # After each run, the benchmark list naming the dashboard metrics is kept for publishing.
    assert kept == [(Path(".asv/results"), listing.KEPT_LIST)] * 2 and recovered == []


def test_the_gates_bench_clears_the_dashboard_variable_and_selects_nothing_by_default(
        asv_run, monkeypatch):
    calls, _, _ = asv_run
    monkeypatch.setenv(asv_tools.DASHBOARD_VARIABLE, "1")  # left over from a dashboard run
    asv_tools.bench(["b"], dashboard=False)
    assert calls == [(("run", "--machine", "test-gpu", "--show-stderr", "--record-samples",
                       "b" * 40 + "^!"), None, "1")]
    # And where it was never set (a fresh shell), there is nothing to clear: no error.
    monkeypatch.delenv(asv_tools.DASHBOARD_VARIABLE, raising=False)
    asv_tools.bench(["b"], dashboard=False)
    assert calls[-1][1] is None


@pytest.mark.parametrize("stop", [KeyboardInterrupt(),
                                  subprocess.CalledProcessError(1, ["asv"])])
def test_an_interrupted_or_failed_asv_run_recovers_the_journals_and_still_stops(
        asv_run, monkeypatch, stop):
    _, kept, recovered = asv_run

    def stopped(*args):
        raise stop

    monkeypatch.setattr(asv_tools, "_asv", stopped)
    with pytest.raises(type(stop)):
        asv_tools.bench(["b", "h"])
    assert recovered == ["test-gpu"] and kept == []  # stopped at the first commit


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git repository of two commits, the first tagged (annotated), as the working folder;
    returns (first, second) commit hashes."""
    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com",
                               "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false", *args],
                              cwd=tmp_path, check=True, capture_output=True,
                              text=True).stdout.strip()

    git("init", "-q")
    for n in (1, 2):
        (tmp_path / "f").write_text(str(n))
        git("add", "f")
        git("commit", "-q", "-m", str(n))
    git("tag", "-a", "v1", "-m", "v1", "HEAD~1")
    monkeypatch.chdir(tmp_path)
    return git("rev-parse", "HEAD~1"), git("rev-parse", "HEAD")


def test_full_hash_names_the_commit_a_revision_points_at(repo):
    first, second = repo
    assert asv_tools.full_hash("HEAD") == second and re.fullmatch(r"[0-9a-f]{40}", second)
    assert asv_tools.full_hash("HEAD~1") == first
    assert asv_tools.full_hash(first[:7]) == first
    assert asv_tools.full_hash("v1") == first  # the tagged commit, not the tag object
    for bad in ("no-such-branch", "HEAD:f"):  # nothing, and a file (no commit)
        with pytest.raises(subprocess.CalledProcessError):
            asv_tools.full_hash(bad)


# -- run: comparing two commits' results ----------------------------------------------------

def _two_commits(root: Path) -> Path:
    """gpu-a's base and head: xla twice as slow and its GB/s halved, pallas unchanged;
    gpu-b (another GPU) saw no change at all."""
    impls = [["'xla'", "'pallas'"]]
    for machine, head in (("gpu-a", [2e-3, 1.001e-3]), ("gpu-b", [1e-3, 1e-3])):
        _results_folder(root, machine, BASE, {TIME: _entry(impls, [1e-3, 1e-3], 1000),
                                              GBPS: _entry(impls, [100.0, 100.0], 1000)})
        _results_folder(root, machine, HEAD, {
            TIME: _entry(impls, head, 2000),
            GBPS: _entry(impls, [100.0 * 1e-3 / head[0], 100.0], 2000)})
    return root


@pytest.fixture
def hashes(monkeypatch):
    monkeypatch.setattr(asv_tools, "full_hash",
                        {"main": BASE, "HEAD": HEAD}.__getitem__)


def test_run_judges_one_hosts_two_commits_and_writes_every_report(tmp_path, hashes, capsys):
    results = str(_two_commits(tmp_path / "results"))
    floors = asv_tools.floors_path("gpu-a", results)
    floors.parent.mkdir()
    floors.write_text(json.dumps({"floors": {f"{TIME}('pallas')": 0.05}}))
    summary, rows_json = tmp_path / "summary.md", tmp_path / "rows.json"
    summary.write_text("earlier step\n")

    assert asv_tools.run("main", "HEAD", machine="gpu-a", results_dir=results,
                         summary_md=str(summary), json_path=str(rows_json)) == 1
    rows = json.loads(rows_json.read_text())
    assert {(r["benchmark"], tuple(r["params"])): r["verdict"] for r in rows} == {
        (TIME, ("'xla'",)): "slower", (TIME, ("'pallas'",)): "same",
        (GBPS, ("'xla'",)): "worse (no samples)", (GBPS, ("'pallas'",)): "same (no samples)"}
    assert set(rows[0]) == {field.name for field in dataclasses.fields(asv_tools.Row)}

    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("machine gpu-a: main (a1a1a1a1) -> HEAD (b2b2b2b2); changes under each "
                      "row's gap count as same: 1%, or wider where its samples spread or its "
                      "learned run-to-run shift is (1 noise floors learned)")
    table = _rows_of("\n".join(out[1:7]))
    assert [row["verdict"] for row in table] == ["same", "slower", "same (no samples)",
                                                 "worse (no samples)"]
    assert table[0]["noise floor"] == "5.0%"  # the learned floors are read and shown
    assert out[7:9] == ["smallest change callable: median 3.0% over 2 time_ rows (range "
                        "1.0%-5.0%); 1 cannot call 2%:",
                        "  Softmax.time_device(pallas): 5.0%, learned run-to-run shift 5.0%"]
    assert out[9:] == ["summary: 1 same, 1 same (no samples), 1 slower, 1 worse (no samples)"]

    text = summary.read_text()
    assert text.startswith("earlier step\n### asv on gpu-a: main (a1a1a1a1) -> HEAD (b2b2b2b2)")
    # The note is its own paragraph after the table; resolution's lines break in Markdown.
    assert text.endswith(
        "</details>\n\nChanges under each row's gap count as same (1%, or wider where its "
        "noise is); 1 noise floors learned.\n\nsmallest change callable: median 3.0% over 2 "
        "time_ rows (range 1.0%-5.0%); 1 cannot call 2%:  \n  Softmax.time_device(pallas): "
        "5.0%, learned run-to-run shift 5.0%\n\n")


def test_run_without_floors_says_none_were_learned(tmp_path, hashes, capsys):
    results = str(_two_commits(tmp_path / "results"))
    summary = tmp_path / "summary.md"
    asv_tools.run("main", "HEAD", machine="gpu-b", results_dir=results, summary_md=str(summary))
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith(
        "learned run-to-run shift is; no noise floors learned here "
        "(`python -m kernels noise-floor`)")
    assert "noise floor " not in out.splitlines()[1]  # no floors column
    assert "Changes under each row's gap count as same (1%, or wider where its noise is).\n" \
        in summary.read_text()


@pytest.mark.parametrize("present,missing", [
    ({"HEAD"}, "main"), ({"main"}, "HEAD"), (set(), "main, HEAD")])
def test_run_names_the_revisions_it_has_no_results_for(tmp_path, hashes, monkeypatch,
                                                        present, missing):
    rows = {(TIME, ("'xla'",)): asv_tools.Result(1e-3, None, None)}
    monkeypatch.setattr(asv_tools, "load", lambda results_dir, machine, commit:
                        rows if {BASE: "main", HEAD: "HEAD"}[commit] in present else {})
    with pytest.raises(SystemExit) as stopped:
        asv_tools.run("main", "HEAD", machine="gpu-a", results_dir="somewhere")
    assert str(stopped.value) == (f"no asv results on machine 'gpu-a' for {missing} in "
                                  "somewhere; run `make bench-compare BASE=main` first")


def _stamped(value, at):
    return asv_tools.Result(value, None, None, started_at=at)


@pytest.mark.parametrize("classes,listed", [
    (["A", "B", "C", "D", "E", "pkg.F"], "A, B, C, D, E, pkg.F"),
    (["A", "B", "C", "D", "E", "F", "G"], "A, B, C, D, E, F, ...")])
def test_run_leaves_out_the_base_rows_earlier_runs_or_the_dashboard_measured(
        tmp_path, hashes, monkeypatch, capsys, classes, listed):
    monkeypatch.chdir(tmp_path)  # the default results folder: no floors learned there
    common = (TIME, ("'xla'",))
    earlier = {(f"benchmarks.{name}.time_device", (p,)): _stamped(1e-3, 1000)
               for name in classes for p in ("'x'", "'y'")}
    dashboard = {(f"benchmarks.S.{metric}", ("'x'",)): _stamped(1.0, 5000)
                 for metric in ("track_tflops", "track_gbps")}
    base = {common: _stamped(1e-3, 5000), **earlier, **dashboard}
    head = {common: _stamped(1e-3, 6000)}
    monkeypatch.setattr(asv_tools, "load", lambda results_dir, machine, commit:
                        base if commit == BASE else head)
    assert asv_tools.run("main", "HEAD", machine="gpu-a", base_since_ms=2000) == 0
    out = capsys.readouterr().out
    assert "FAILED" not in out and "summary: 1 same" in out
    assert (f"left out: {len(earlier)} rows of main that only an earlier asv run measured and "
            f"HEAD's run did not select ({listed})\n") in out
    assert ("left out: 2 rows of main's dashboard metrics (track_gbps, track_tflops) that "
            "HEAD's run did not record (`kernels bench --dashboard` records them)\n") in out


@pytest.mark.parametrize("head_value,rounds,asked", [
    (2e-3, 3, True), (0.5e-3, 3, True), (1e-3, 3, False), (2e-3, 0, False)])
def test_run_measures_changed_rows_again_only_when_asked(tmp_path, hashes, monkeypatch,
                                                         capsys, head_value, rounds, asked):
    """A slower and a faster row are measured again in `confirm_rounds` interleaved rounds
    before they count; what the re-measurement says is the verdict."""
    from kernels.bench import confirm

    monkeypatch.chdir(tmp_path)  # the default results folder: no floors learned there

    key, calls = (TIME, ("'xla'",)), []
    monkeypatch.setattr(asv_tools, "load", lambda results_dir, machine, commit: {
        key: asv_tools.Result(1e-3 if commit == BASE else head_value, None, None)})

    def fake_confirm(rows, base, head, *, rounds, measure):
        assert measure is None  # asv_tools.run's default: live workers over the trees
        calls.append((base, head, rounds, [row.verdict for row in rows]))
        return [dataclasses.replace(row, verdict="same (not confirmed)", confirmed="1.00 0.99")
                for row in rows]

    monkeypatch.setattr(confirm, "confirm", fake_confirm)
    status = asv_tools.run("main", "HEAD", machine="gpu-a", confirm_rounds=rounds)
    if asked:
        word = "slower" if head_value > 1e-3 else "faster"
        assert calls == [(BASE, HEAD, rounds, [word])] and status == 0
        assert _rows_of("\n".join(capsys.readouterr().out.splitlines()[1:4]))[0][
            "re-measured (head/base per round)"] == "1.00 0.99"
    else:
        assert calls == [] and status == (head_value > 1e-3)


def test_one_commit_as_base_and_head_lists_its_values_from_the_default_folder(
        tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    params = [["'XLA'", "'pallas'"], ["'f32'"]]
    _results_folder(tmp_path / ".asv" / "results", "gpu-a", BASE, {
        TIME: _entry(params, [1.0, None], 1), GBPS: _entry(params, [250.0, 12.5], 1)})
    _results_folder(tmp_path / ".asv" / "results", "gpu-b", BASE,
                    {TIME: _entry(params, [9.0, 9.0], 1)})
    monkeypatch.setattr(asv_tools, "full_hash", lambda revision: BASE)
    assert asv_tools.run("main", "HEAD", machine="gpu-a") == 0
    first, *table = capsys.readouterr().out.splitlines()
    assert first == ("machine gpu-a: main and HEAD are the same commit (a1a1a1a1): nothing to "
                     "compare (asv keeps one result per commit); its values follow. "
                     "`make noise-floor` compares runs of one commit.")
    # Sorted, units given, the failed pallas row left out, the module prefix dropped.
    assert _rows_of("\n".join(table)) == [
        {"benchmark": "Softmax.time_device", "parameters": "XLA, f32", "value": "1000000.00 us"},
        {"benchmark": "Softmax.track_gbps", "parameters": "XLA, f32", "value": "250 GB/s"},
        {"benchmark": "Softmax.track_gbps", "parameters": "pallas, f32", "value": "12.5 GB/s"}]

    monkeypatch.setattr(asv_tools, "full_hash", lambda revision: HEAD)  # no results for it
    with pytest.raises(SystemExit) as stopped:
        asv_tools.run("main", "HEAD", machine="gpu-a", results_dir=".asv/results")
    assert str(stopped.value) == ("no asv results on machine 'gpu-a' for HEAD in .asv/results; "
                                  "run `make bench` first")


# -- noise floors ---------------------------------------------------------------------------

def test_floors_are_kept_beside_the_results_folder_not_in_it(tmp_path, monkeypatch):
    """asv reads every JSON file under its results folder as a result."""
    assert asv_tools.floors_path("m", "x/results") == Path("x/noise-floors/m.json")
    monkeypatch.chdir(tmp_path)
    assert asv_tools.floors_path("m") == Path(".asv/noise-floors/m.json")
    assert asv_tools.load_floors("m") == {}  # none learned yet
    Path(".asv/noise-floors").mkdir(parents=True)
    Path(".asv/noise-floors/m.json").write_text(json.dumps({"floors": {"b.S.time_x()": 0.1}}))
    assert asv_tools.load_floors("m") == {"b.S.time_x()": 0.1}


def test_learn_floors_stores_what_the_runs_measured_and_keeps_earlier_floors(
        tmp_path, monkeypatch):
    soft, once = (TIME, ("'xla'",)), (TIME, ("'pallas'",))
    stale = ("benchmarks.Stale.time_device", ("'xla'",))
    hour_ago = (time.time() - 3600) * 1000
    stdout, asked, loaded = _Stdout(), [], []
    monkeypatch.setattr(sys, "stdout", stdout)
    monkeypatch.setattr(asv_tools, "full_hash", lambda revision: asked.append(revision) or "d" * 40)

    def fake_bench(revisions, bench_regex=None):
        assert not stdout.pending, "progress must be flushed before asv writes"
        asked.append((revisions, bench_regex))
        return "gpu-a"

    values = iter([1.0e-3, 1.25e-3, 1.1e-3])

    def fake_load(results_dir, machine, commit):
        loaded.append((results_dir, machine, commit))
        now, value = time.time() * 1000, next(values)
        # An earlier run's row (older than this run) with a value far off: not this run's.
        rows = {soft: _stamped(value, now), stale: _stamped(value * 50, hour_ago),
                (GBPS, ("'xla'",)): _stamped(1 / value, now)}
        return {**rows, once: _stamped(1e-3, now)} if len(loaded) == 1 else rows

    monkeypatch.setattr(asv_tools, "bench", fake_bench)
    monkeypatch.setattr(asv_tools, "load", fake_load)
    results = str(tmp_path / "results")
    path = asv_tools.floors_path("gpu-a", results)
    path.parent.mkdir()
    attention, old = "benchmarks.Attention.time_device('xla')", "benchmarks.Old.time_device()"
    path.write_text(json.dumps({
        "floors": {attention: 0.3, old: 0.05, asv_tools.floor_key(soft): 0.9},
        "learned": {attention: {"commit": "e" * 40, "runs": 4},
                    asv_tools.floor_key(soft): {"commit": "f" * 40, "runs": 2},
                    "benchmarks.Gone.time_device()": {"commit": "f" * 40, "runs": 2}}}))

    learned = asv_tools.learn_floors("v1", 3, bench_regex="Softmax", results_dir=results)
    assert learned == {asv_tools.floor_key(soft): pytest.approx(0.25)}
    assert asked == ["v1", *[(["v1"], "Softmax")] * 3]
    assert loaded == [(results, "gpu-a", "d" * 40)] * 3
    stored = json.loads(path.read_text())
    assert stored == {"floors": {attention: 0.3, old: 0.05,
                                 asv_tools.floor_key(soft): pytest.approx(0.25)},
                      "learned": {attention: {"commit": "e" * 40, "runs": 4},
                                  asv_tools.floor_key(soft): {"commit": "d" * 40, "runs": 3}}}
    # One floor a line: a re-learned floor reads as a one-line change in a diff.
    assert any(line.strip().startswith(f'"{attention}": 0.3')
               for line in path.read_text().splitlines())

    out = stdout.flushed + stdout.pending
    assert [line for line in out.splitlines() if line.startswith("noise floor: run")] == [
        f"noise floor: run {n} of 3 on v1 (dddddddd)" for n in (1, 2, 3)]
    table = "\n".join(out.splitlines()[3:-1])
    assert _rows_of(table) == [
        {"benchmark": "Softmax.time_device('pallas')",
         "noise floor": "none (measured in fewer than 2 runs)", "source": "-"},
        {"benchmark": "Softmax.time_device('xla')", "noise floor": "25.0%",
         "source": "learned now"},
        {"benchmark": "Attention.time_device('xla')", "noise floor": "30.0%",
         "source": "kept (commit eeeeeeee)"},
        {"benchmark": "Old.time_device()", "noise floor": "5.0%", "source": "kept (commit ?)"}]
    assert out.splitlines()[-1] == f"wrote {path}: 1 learned now, 2 kept from earlier runs"


def test_learn_floors_writes_to_the_default_folder_it_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no .asv folder yet
    key, loaded = (TIME, ("'xla'",)), []
    values = iter([1.0e-3, 1.5e-3])
    monkeypatch.setattr(asv_tools, "full_hash", lambda revision: "d" * 40)
    monkeypatch.setattr(asv_tools, "bench", lambda revisions, bench_regex=None: "gpu-a")
    monkeypatch.setattr(asv_tools, "load", lambda results_dir, machine, commit: loaded.append(
        results_dir) or {key: _stamped(next(values), time.time() * 1000)})
    assert asv_tools.learn_floors("HEAD", 2) == {asv_tools.floor_key(key): pytest.approx(0.5)}
    assert loaded == [".asv/results"] * 2
    assert asv_tools.load_floors("gpu-a") == {asv_tools.floor_key(key): pytest.approx(0.5)}


# -- the tables a reader sees ---------------------------------------------------------------

def _row(benchmark, params=("'xla'",), base=1.0, head=1.0, ratio=1.0, verdict="same", **more):
    return asv_tools.Row(benchmark, params, base, head, ratio, verdict, **more)


def test_the_table_gives_each_rows_values_in_their_units_ratio_gap_and_verdict():
    # Only the quotes go: a parameter's own letters stay, an X at its end included.
    rows = [_row(TIME, ("'XLA'", "'f32-64x1000'"), 1.0, 2.0, 2.0, "slower", gap=0.05,
                 why="sample spread 1.2%"),
            _row(GBPS, base=100.0, head=90.5, ratio=0.905, verdict="worse (no samples)",
                 gap=0.01),
            _row("benchmarks.Softmax.track_tflops", base=None, head=512.0, ratio=None,
                 verdict="new"),
            _row("other.S.track_custom", base=3.14159, head=None, ratio=None,
                 verdict="FAILED on head", gap=0.01),
            _row("track_launch", base=12.0, head=12.0)]  # a bare method still reads its unit
    table = _rows_of(asv_tools.render(rows))
    assert table == [
        {"benchmark": "Softmax.time_device", "parameters": "XLA, f32-64x1000",
         "base": "1000000.00 us", "head": "2000000.00 us", "head/base": "2.000",
         "gap": "5.0% (sample spread 1.2%)", "verdict": "slower"},
        {"benchmark": "Softmax.track_gbps", "parameters": "xla", "base": "100 GB/s",
         "head": "90.5 GB/s", "head/base": "0.905", "gap": "1.0%",
         "verdict": "worse (no samples)"},
        {"benchmark": "Softmax.track_tflops", "parameters": "xla", "base": "-",
         "head": "512 TFLOP/s", "head/base": "-", "gap": "-", "verdict": "new"},
        {"benchmark": "other.S.track_custom", "parameters": "xla", "base": "3.14", "head": "-",
         "head/base": "-", "gap": "1.0%", "verdict": "FAILED on head"},
        {"benchmark": "track_launch", "parameters": "xla", "base": "12 us (host)",
         "head": "12 us (host)", "head/base": "1.000", "gap": "-", "verdict": "same"}]


def test_the_table_adds_floor_and_re_measurement_columns_only_where_they_say_something():
    timed = _row(TIME, verdict="same (not confirmed)", confirmed="1.01 0.99")
    unfloored, tracked = _row(TIME, ("'pallas'",)), _row(GBPS)
    floors = {asv_tools.floor_key((TIME, ("'xla'",))): 0.2}
    table = _rows_of(asv_tools.render([timed, unfloored, tracked], floors))
    # track_ rows keep no samples to learn a floor from; a time_ row may have none yet.
    assert [row["noise floor"] for row in table] == ["20.0%", "none", "-"]
    assert [row["re-measured (head/base per round)"] for row in table] == ["1.01 0.99", "-", "-"]
    assert list(table[0]) == ["benchmark", "parameters", "base", "head", "head/base", "gap",
                              "noise floor", "re-measured (head/base per round)", "verdict"]
    plain = asv_tools.render([unfloored]).splitlines()[0]
    assert "noise floor" not in plain and "re-measured" not in plain


def _markdown_tables(text: str) -> list[list[list[str]]]:
    """Each Markdown table of `text` as its rows of cells (header and rule included)."""
    tables, current = [], None
    for line in text.splitlines():
        if line.startswith("|"):
            if current is None:
                current = []
                tables.append(current)
            current.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]])
        else:
            current = None
    return tables


def test_markdown_orders_rows_by_what_a_reviewer_must_see_first():
    # Names run against the verdicts' order, so only the verdict can put them in order.
    words = [*asv_tools.VERDICT_ORDER, "some verdict of the future"]
    rows = [_row(f"benchmarks.S{len(words) - i:02d}.time_device", verdict=word,
                 head=None if word == "FAILED on head" else 1.0,
                 ratio=None if word in ("FAILED on head", "new") else 1.0)
            for i, word in enumerate(words)]
    text = asv_tools.render_markdown(rows[::-1], "asv: main -> HEAD")
    lines = text.splitlines()
    assert lines[:2] == ["### asv: main -> HEAD", ""]
    assert lines[2] == ", ".join(f"**1 {w}**" if w in ("FAILED on head", "slower") else
                                 f"1 {w}" for w in words)
    changed, same = _markdown_tables(text)
    header = ["verdict", "benchmark", "parameters", "base", "head", "head/base"]
    assert changed[:2] == same[:2] == [header, ["---", "---", "---", "---:", "---:", "---:"]]
    bold = {"FAILED on head": "**FAILED on head**", "slower": "**slower**"}
    assert [cells[0] for cells in changed[2:]] == [
        bold.get(w, w) for w in words if not w.startswith("same")]
    assert [cells[0] for cells in same[2:]] == [w for w in words if w.startswith("same")]
    assert changed[2][3:] == ["1000000.00 us", "-", "-"]  # failed on the head: no value


def test_markdown_sets_each_table_apart_as_github_needs_and_escapes_pipes():
    """A table renders only after a blank line, and inside <details> only after one below
    <summary>; a "|" in a name would split its cell."""
    rows = [_row("benchmarks.A|B.time_device", ("'x|y'", "'MAX'"), verdict="slower", ratio=2.0),
            _row(TIME, verdict="same")]
    lines = asv_tools.render_markdown(rows, "h").splitlines()
    assert lines == ["### h", "", "**1 slower**, 1 same", "",
                     "| verdict | benchmark | parameters | base | head | head/base |",
                     "|---|---|---|---:|---:|---:|",
                     "| **slower** | A\\|B.time_device | x\\|y, MAX | 1000000.00 us | "
                     "1000000.00 us | 2.000 |", "",
                     "<details><summary>1 unchanged</summary>", "",
                     "| verdict | benchmark | parameters | base | head | head/base |",
                     "|---|---|---|---:|---:|---:|",
                     "| same | Softmax.time_device | xla | 1000000.00 us | 1000000.00 us | "
                     "1.000 |", "", "</details>"]
    only_changed = asv_tools.render_markdown(rows[:1], "h")
    assert "<details>" not in only_changed and only_changed.endswith("| 2.000 |\n")
    assert asv_tools.render_markdown([], "h") == "### h\n\nno results\n"


def test_resolution_is_the_median_gap_of_time_rows_and_the_rows_that_cannot_call_the_target():
    gaps = [0.05, 0.01, 0.02, 0.03]  # median of an even count: the middle two's mean
    rows = [_row(TIME, (f"'{n}'", "'f32'"), gap=gap, why=f"why {n}")
            for n, gap in enumerate(gaps)]
    rows += [_row(GBPS, gap=0.5, why="device time's"), _row(TIME, ("'new'",), gap=None)]
    assert asv_tools.resolution(rows) == (
        "smallest change callable: median 2.5% over 4 time_ rows (range 1.0%-5.0%); "
        "2 cannot call 2%:\n"  # exactly 2% can be called
        "  Softmax.time_device(0, f32): 5.0%, why 0\n"
        "  Softmax.time_device(3, f32): 3.0%, why 3")
    odd = [_row(TIME, (f"'{g}'",), gap=g) for g in (0.05, 0.01, 0.011, 0.012, 0.03)]
    assert asv_tools.resolution(odd, target=0.05) == (
        "smallest change callable: median 1.2% over 5 time_ rows (range 1.0%-5.0%); "
        "0 cannot call 5%")
    nothing = "smallest change callable: no time_ rows with results on both sides"
    assert asv_tools.resolution(rows[4:]) == nothing and asv_tools.resolution([]) == nothing
    # A row held at a --min-gap above the target has no noise reason: the gap asked is why
    # (it printed "None" once).
    asked = [_row(TIME, ("'xla'",), gap=0.05, why=None)]
    assert asv_tools.resolution(asked).splitlines()[1] == \
        "  Softmax.time_device(xla): 5.0%, the gap asked for (--min-gap)"


def test_markdown_counts_verdicts_it_does_not_know_in_the_same_order_every_run():
    """Verdicts outside VERDICT_ORDER share its last rank: their names order them, not a
    set's hash order, which changes between processes."""
    words = ["zeta verdict", "alpha verdict", "slower", "mid verdict"]
    rows = [_row(TIME, (f"'{n}'",), verdict=word) for n, word in enumerate(words)]
    for order in (rows, rows[::-1], rows[1:] + rows[:1]):
        assert asv_tools.render_markdown(order, "h").splitlines()[2] == \
            "**1 slower**, 1 alpha verdict, 1 mid verdict, 1 zeta verdict"


# -- the samples' gap at its edges ----------------------------------------------------------

def test_two_samples_a_side_already_set_a_gap_and_one_does_not():
    wide = asv_tools.Result(1e-3, [1e-3, 1.2e-3], None)
    assert asv_tools.threshold(TIME, wide, wide).gap > 0.1
    single = asv_tools.Result(1e-3, [1e-3], None)
    assert asv_tools.threshold(TIME, single, wide).gap == asv_tools.DEFAULT_MIN_GAP
    # Samples with no positive median have no relative spread: they set no gap.
    zero = asv_tools.Result(1e-3, [0.0, 0.0, 0.0], None)
    assert asv_tools.threshold(TIME, zero, zero) == asv_tools.Threshold(
        asv_tools.DEFAULT_MIN_GAP)
    assert asv_tools._spread(None) == 0.0 == asv_tools._spread(
        asv_tools.Result(1.0, None, None))


@pytest.mark.parametrize("base_us,head_us,shorter", [(8, 30, 8.0), (30, 8, 8.0)])
def test_a_launch_bound_kernel_is_named_whichever_side_is_short(base_us, head_us, shorter):
    def timed(us):  # a spread wide enough that the samples set the gap
        return asv_tools.Result(us * 1e-6, [us * 1e-6 * f for f in (0.7, 1.0, 1.3)], None)

    why = asv_tools.threshold(TIME, timed(base_us), timed(head_us)).why
    assert why.startswith("sample spread ")
    assert why.endswith(f"%, a {shorter:.1f} us kernel (launch-bound)")
    long = asv_tools.threshold(TIME, timed(30), timed(40)).why
    assert re.fullmatch(r"sample spread \d+\.\d%", long)  # nothing after the spread


def test_the_launch_bound_hint_reads_the_shorter_measured_side_below_20_us():
    def result(value):
        return asv_tools.Result(value, None, None)

    assert asv_tools._short(None, result(5e-6)) == "a 5.0 us kernel (launch-bound)"
    assert asv_tools._short(result(0.0), result(5e-6)) == "a 5.0 us kernel (launch-bound)"
    assert asv_tools._short(result(20e-6), None) == ""  # 20 us is not below 20 us
    assert asv_tools._short(result(1e-3), result(2e-3)) == ""
