"""The pull request's job summary: the compare's verdict table as Markdown, changes first."""

# Imported, not importorskip'd: a broken kernels.bench.asv_tools must fail here (it needs no asv to
# import; test_test_hygiene checks the rule).
from kernels.bench import asv_tools

TIME = "benchmarks.Softmax.time_device"
ROWS = [
    asv_tools.Row(TIME, ("'xla'", "'f32-64x1000'", "'fwd'"), 1e-3, 1.001e-3, 1.001, "same"),
    asv_tools.Row(TIME, ("'pallas'", "'f32-64x1000'", "'fwd'"), 1e-3, 0.5e-3, 0.5, "faster"),
    asv_tools.Row(TIME, ("'a|b'", "'f32-64x1000'", "'bwd'"), 1e-3, 2e-3, 2.0, "slower"),
    asv_tools.Row("benchmarks.Softmax.track_tflops", ("'xla'", "'f32-64x1000'", "'fwd'"),
                  1.0, 1.01, 1.01, "same (no samples)"),
]


def test_markdown_puts_slower_rows_first_and_folds_unchanged_ones():
    text = asv_tools.render_markdown(ROWS, "asv on cpu: main -> HEAD")
    lines = text.splitlines()
    assert lines[0] == "### asv on cpu: main -> HEAD"
    assert lines[2] == "**1 slower**, 1 faster, 1 same (no samples), 1 same"
    changed, folded = text.split("<details>")
    table = [line for line in changed.splitlines() if line.startswith("| ")]
    assert table[1].startswith("| **slower** | Softmax.time_device | a\\|b, f32-64x1000, bwd | "
                               "1000.00 us | 2000.00 us | 2.000 |"), table
    assert table[2].startswith("| faster |") and len(table) == 3
    assert "<summary>2 unchanged</summary>" in folded
    assert "| same | Softmax.time_device | xla, f32-64x1000, fwd |" in folded
    assert "| same (no samples) | Softmax.track_tflops |" in folded


def test_compare_appends_its_summary_and_still_fails_on_a_slowdown(tmp_path, monkeypatch):
    base = {(TIME, ("'xla'",)): asv_tools.Result(1e-3, None, None)}
    head = {(TIME, ("'xla'",)): asv_tools.Result(2e-3, None, None)}
    monkeypatch.setattr(asv_tools, "full_hash", lambda rev: rev.ljust(40, "0"))
    monkeypatch.setattr(asv_tools, "load", lambda _dir, _machine, commit:
                        base if commit.startswith("base") else head)
    summary = tmp_path / "step_summary.md"
    summary.write_text("earlier step\n")
    status = asv_tools.run("base", "head", machine="cpu", results_dir=str(tmp_path / "results"),
                           summary_md=str(summary))
    assert status == 1
    text = summary.read_text()
    assert text.startswith("earlier step\n### asv on cpu: base (base0000) -> head (head0000)")
    assert "| **slower** | Softmax.time_device | xla | 1000.00 us | 2000.00 us | 2.000 |" in text
