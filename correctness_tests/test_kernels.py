"""Every registered implementation against its operation's reference, forward and gradients."""

import numpy as np
import pytest

from kernels.core import checking, frameworks, phases
from kernels.testing import phases_plugin

SEEDS = (0, 1)


def test_matches_reference(kernel_item, record_property):
    """Fresh inputs per seed: output, gradients, untouched inputs (kernels.core.checking).

    Real-size cases take one seed: the small cases already vary the seed, and a
    10^8-element case costs seconds per comparison. Inputs and references come from
    this process's cache, shared with the other implementations of the case; the
    phases' times go to the end-of-run breakdown.
    """
    worst = 0.0
    seeds = SEEDS if "cpu" in kernel_item.case.tags else SEEDS[:1]
    timer = phases.PhaseTimer()
    try:
        with timer.active():
            for seed in seeds:
                for result in checking.check(kernel_item.impl, kernel_item.case, seed=seed,
                                             distribution=kernel_item.distribution,
                                             references=checking.shared_references(),
                                             timer=timer):
                    worst = max(worst, result.relative_error / result.tolerance)
                    record_property(f"{result.name.split()[-1]}_seed{seed}_rel_err",
                                    result.relative_error)
    finally:
        record_property(phases_plugin.PROPERTY, {"op": kernel_item.impl.op,
                                                 "seconds": dict(timer.seconds)})
    record_property("worst_error_over_tolerance", worst)


def test_rejects_bad_input(bad_input_item):
    impl, bad = bad_input_item
    args = bad.make_args()
    if impl.framework != "jax":
        # JAX functions take numpy arrays as they are; converting first would turn
        # float64 into float32 and hide the dtype error under test.
        fw = frameworks.framework(impl.framework)
        args = [fw.from_numpy([np.asarray(a)])[0] if isinstance(a, np.ndarray | np.generic) else a
                for a in args]
    with pytest.raises(bad.error, match=bad.match):
        impl.fn(*args)
