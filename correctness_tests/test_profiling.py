"""Profiling helpers: traces land in traces/{date}/{name}/, and the top-kernels table is read
from them; the CLI's profile, memory and hlo commands."""

from __future__ import annotations

import datetime

import jax
import jax.numpy as jnp
import pytest

from kernels import cli
from kernels.core import devices, registry
from kernels.guards import hlo
from kernels.profile import profiling


def _softmax_call():
    impl = registry.implementation("softmax", "xla")
    x = jnp.asarray(jax.random.normal(jax.random.key(0), (64, 1000), jnp.float32))
    return impl.fn, x


def test_quick_profile_writes_a_dated_trace_and_names_real_kernels(tmp_path):
    fn, x = _softmax_call()
    trace = profiling.quick_profile("softmax-xla", lambda: fn(x), iterations=3, root=tmp_path,
                                    report=False)
    day = datetime.date.today().isoformat()
    assert trace.directory == tmp_path / day / "softmax-xla"
    assert trace.top.xplane.is_relative_to(trace.directory)
    assert trace.top.kernels and trace.top.total_ns > 0
    # Every kernel is one the compiled program contains, run once per traced call.
    compiled = hlo.compiled_text(fn, (x,))
    for kernel in trace.top.kernels:
        if not devices.this_machine().has_gpu:
            assert f"%{kernel.name} = " in compiled, kernel.name
        assert kernel.calls % 3 == 0, kernel


def test_profile_comparison_traces_each_label(tmp_path, capsys):
    fn, x = _softmax_call()
    traces = profiling.profile_comparison("pair", ("softmax", lambda: fn(x)),
                                          ("exp", lambda: jnp.exp(x)), iterations=2,
                                          root=tmp_path, top=3)
    assert set(traces) == {"softmax", "exp"}
    for label, trace in traces.items():
        assert trace.directory.name == label and trace.top.kernels
    printed = capsys.readouterr().out
    assert "device us/call" in printed and "top " in printed


def test_profile_context_manager(tmp_path):
    fn, x = _softmax_call()
    jax.block_until_ready(fn(x))
    with profiling.profile("block", root=tmp_path, report=False) as trace:
        jax.block_until_ready(fn(x))
    assert trace.top.kernels


def test_bad_names_are_rejected():
    with pytest.raises(ValueError, match="name: expected a non-empty name without '/', "
                                         "got 'a/b'"):
        profiling.trace_dir("a/b")
    with pytest.raises(FileNotFoundError, match="expected a trace"):
        profiling.latest_xplane("/nonexistent")


def test_cli_profile_memory_and_hlo(tmp_path, capsys):
    assert cli.main(["profile", "softmax", "--impl", "xla", "--case", "f32-37x128",
                     "--iterations", "2", "--top", "3", "--traces", str(tmp_path)]) == 0
    assert "kernels by device time" in capsys.readouterr().out
    assert cli.main(["memory", "mlp", "--case", "f32-8x16x64x2"]) == 0
    printed = capsys.readouterr().out
    assert "compiled peak" in printed and "xla_remat" in printed and "bwd" in printed
    assert cli.main(["hlo", "softmax", "--impl", "xla", "--case", "f32-37x128"]) == 0
    assert "softmax-xla f32-37x128 fwd" in capsys.readouterr().out
    assert cli.main(["hlo", "softmax", "--impl", "xla", "--case", "nope"]) == 2
    assert "--case: expected one of" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not devices.this_machine().has_gpu,
                    reason="needs a CUDA GPU: device kernels are traced through CUPTI")
def test_gpu_trace_reads_the_device_plane(tmp_path):
    fn, x = _softmax_call()
    trace = profiling.quick_profile("gpu", lambda: fn(x), iterations=3, root=tmp_path,
                                    report=False)
    assert "/device:GPU" in trace.top.source, trace.top.source
    assert trace.top.kernels
