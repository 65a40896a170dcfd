"""kernels.core.validation's checks on plain numpy arrays: each error names the argument, what was
expected and what came, word for word."""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import pytest

from correctness_tests import fakes
from kernels.core import validation


class _ShapeOnly:
    shape = (2, 2)


def test_check_array_needs_shape_and_dtype():
    with pytest.raises(TypeError, match=r"^x: expected an array, got _ShapeOnly$"):
        validation.check_array("x", _ShapeOnly())
    with pytest.raises(TypeError, match=r"^y: expected an array, got list$"):
        validation.check_array("y", [1.0])


def test_check_array_rank_edges():
    validation.check_array("x", np.ones((2, 3)))  # no rank asked: anything goes
    validation.check_array("x", np.float32(1.0))  # a scalar too
    validation.check_array("x", np.ones((2, 3)), rank=2)
    validation.check_array("x", np.ones((2, 3)), min_rank=2)  # exactly the minimum
    with pytest.raises(ValueError, match=r"^x: expected rank >= 3, got shape \(2, 3\) "
                                         r"\(rank 2\)$"):
        validation.check_array("x", np.ones((2, 3)), min_rank=3)
    with pytest.raises(ValueError, match=r"^x: expected rank 1, got shape \(2, 3\) \(rank 2\)$"):
        validation.check_array("x", np.ones((2, 3)), rank=1)


def test_check_array_dtypes():
    validation.check_array("x", np.ones(2, np.int32))  # no dtypes asked
    validation.check_array("x", np.ones(2, np.float32), allowed_dtypes=["f32", "f16"])
    with pytest.raises(TypeError, match=r"^x: expected dtype in \(float32, float16\), got "
                                        r"int32$"):
        validation.check_array("x", np.ones(2, np.int32), allowed_dtypes=iter(["f32", "f16"]))


def test_check_same_dtype_and_nonempty_axis():
    validation.check_same_dtype(a=np.ones(1, np.float32), b=np.ones(1, np.float32))
    with pytest.raises(TypeError, match=r"^expected one dtype for a, b, got a=float32, "
                                        r"b=float16$"):
        validation.check_same_dtype(a=np.ones(1, np.float32), b=np.ones(1, np.float16))
    validation.check_nonempty_axis("x", np.ones((0, 1)), 1)
    with pytest.raises(ValueError, match=r"^x: expected a non-empty axis 0, got shape "
                                         r"\(0, 1\)$"):
        validation.check_nonempty_axis("x", np.ones((0, 1)), 0)


@dataclasses.dataclass(frozen=True)
class _Blocks:
    block: int
    warps: int = 4


def test_check_powers_of_two():
    validation.check_powers_of_two(_Blocks(1), ("block",))
    validation.check_powers_of_two(_Blocks(16), ("block", "warps"), at_least=4)
    with pytest.raises(ValueError, match=r"^block: expected a power of two, got 12$"):
        validation.check_powers_of_two(_Blocks(12), ("block",))
    with pytest.raises(ValueError, match=r"^block: expected a power of two >= 16, got 8$"):
        validation.check_powers_of_two(_Blocks(8), ("block",), at_least=16)
    with pytest.raises(ValueError, match=r"^block: expected a power of two, got 0$"):
        validation.check_powers_of_two(_Blocks(0), ("block",))


def test_check_config_and_flag():
    validation.check_config(None, _Blocks)
    validation.check_config(_Blocks(4), _Blocks)
    with pytest.raises(TypeError, match=r"^config: expected a _Blocks or None, got dict "
                                        r"\{'block': 4\}$"):
        validation.check_config({"block": 4}, _Blocks)
    for ok in (True, False, None):
        validation.check_flag("interpret", ok)
    with pytest.raises(TypeError, match=r"^interpret: expected True, False or None, got str "
                                        r"'no'$"):
        validation.check_flag("interpret", "no")


def test_check_x64_refuses_what_jax_would_narrow():
    import jax

    validation.check_x64_for("x", np.ones(2, np.float32))
    if jax.config.jax_enable_x64:
        pytest.skip("x64 is on here: JAX keeps float64")
    for dtype in (np.float64, np.int64):
        with pytest.raises(TypeError, match=rf"^x: expected a dtype JAX keeps as it is, got "
                                            rf"{np.dtype(dtype).name} \(jax_enable_x64 is off"):
            validation.check_x64_for("x", np.ones(2, dtype))


def test_check_x64_covers_every_wide_dtype_and_non_arrays():
    import jax

    validation.check_x64_for("x", [1.0])  # no dtype: nothing for JAX to narrow
    if jax.config.jax_enable_x64:
        pytest.skip("x64 is on here: JAX keeps 64-bit types")
    for dtype in (np.uint64, np.complex128):
        with pytest.raises(TypeError, match=rf"got {np.dtype(dtype).name} "):
            validation.check_x64_for("x", np.ones(2, dtype))


def test_check_index_range_edges():
    validation.check_index_range("x", fakes.Shape(()))  # a scalar: offset 0
    validation.check_index_range("x", fakes.Shape((0, 2**40)))  # empty: nothing is addressed
    with pytest.raises(ValueError, match=r"^x: expected offsets below 2\*\*31 \(32-bit index "
                                         r"arithmetic\), got shape \(65536, 65536\): largest "
                                         r"offset 4294967295, largest dimension 65536$"):
        validation.check_index_range("x", fakes.Shape((2**16, 2**16)))
    with pytest.raises(ValueError, match=r"got shape \(1, 2147483649\) with strides \(0, 0\): "
                                         r"largest offset 0, largest dimension 2147483649$"):
        validation.check_index_range("x", fakes.Shape((1, 2**31 + 1), (0, 0)))


def test_check_messages_at_their_edges():
    with pytest.raises(TypeError) as caught:
        validation.check_config("x" * 300, _Blocks)
    assert len(str(caught.value)) == 200  # a long value is cut, not the message's start
    with pytest.raises(ValueError, match=r"^block: expected a power of two >= 2, got 3$"):
        validation.check_powers_of_two(_Blocks(3), ("block",), at_least=2)


def test_check_torch_tensor_names_the_device_of_the_first_argument():
    torch = pytest.importorskip("torch")  # third-party
    first = torch.zeros(2)
    with pytest.raises(ValueError, match=r"^b: expected device cpu like the first argument, "
                                         r"got meta$"):
        validation.check_torch_tensor("b", torch.zeros(2, device="meta"), "meta", like=first)


def test_int_at_least_takes_a_number_at_its_minimum_and_refuses_below():
    at_least_3 = validation.int_at_least(3)
    assert at_least_3("3") == 3 and isinstance(at_least_3("4"), int)
    for text, shown in (("2", "'2'"), ("3.5", "'3.5'"), ("x", "'x'")):
        with pytest.raises(argparse.ArgumentTypeError) as refused:
            at_least_3(text)
        assert str(refused.value) == f"expected an integer >= 3, got {shown}"


def test_the_argument_parser_refuses_a_mistake_in_one_line_with_status_2(capsys):
    parser = validation.ArgumentParser(prog="kernels demo")
    parser.add_argument("--runs", type=validation.int_at_least(2))
    with pytest.raises(SystemExit) as refused:
        parser.parse_args(["--runs", "1"])
    assert refused.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "kernels demo: error: argument --runs: expected an integer >= 2, got '1' "
        "(--help for usage)")


def test_an_unknown_name_refuses_with_its_message_alone():
    message = "op: expected one of ['softmax'], got 'sofmax'"
    assert str(validation.UnknownName(message)) == message  # not KeyError's quoted repr
    assert str(validation.UnknownName()) == ""
    assert isinstance(validation.UnknownName(message), KeyError)
