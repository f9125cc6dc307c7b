"""InputConverter's rules without HTTP: dtypes, ranks, and Cortex's reshape of values of a lower rank."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from modelserve.errors import BadRequest
from modelserve.runtimes._tensors import Dim, InputConverter, TensorSpec

FLOAT = np.dtype(np.float32)


def convert(shape: tuple[Dim, ...], value: Any) -> np.ndarray:
    return InputConverter([TensorSpec("input", FLOAT, shape)])(value)["input"]


@pytest.mark.parametrize(
    ("shape", "value", "expected"),
    [
        (("batch", 4), [1, 2, 3, 4], (1, 4)),  # a converter's [N, 4]: four numbers are one row
        ((None, 4), [1, 2, 3, 4], (1, 4)),
        ((1, 4), [1, 2, 3, 4], (1, 4)),
        ((None,), 5.2, (1,)),  # a scalar for a TensorFlow [None] input
        ((1, 2, 2), [[1, 2], [3, 4]], (1, 2, 2)),
        ((None, 2, 2), [1, 2, 3, 4], (1, 2, 2)),
    ],
)
def test_a_value_of_lower_rank_is_reshaped_with_unknown_dimensions_as_1(
    shape: tuple[Dim, ...], value: Any, expected: tuple[int, ...]
) -> None:
    array = convert(shape, value)
    assert array.shape == expected and array.dtype == FLOAT
    assert array.ravel().tolist() == np.asarray(value, dtype=FLOAT).ravel().tolist()


@pytest.mark.parametrize(
    ("shape", "value", "fragments"),
    [
        (("batch", 4), [1, 2, 3], ["[batch, 4] (rank 2)", "received shape [3] (rank 1)", "do not fill [1, 4]"]),
        ((None,), [[1], [2]], ["[null] (rank 1)", "received shape [2, 1] (rank 2)"]),
        (("batch", 4), [[[1, 2, 3, 4]]], ["received shape [1, 1, 4] (rank 3)"]),
        ((2, 2), [1, 2, 3, 4, 5], ["do not fill [2, 2]"]),
        ((None, None), [1, 2, 3], ["do not fill [1, 1]"]),  # every unknown dimension is 1, as in Cortex 0.11
    ],
)
def test_what_cannot_be_reshaped_is_the_precise_400(shape: tuple[Dim, ...], value: Any, fragments: list[str]) -> None:
    with pytest.raises(BadRequest) as caught:
        convert(shape, value)
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_values_of_the_right_rank_are_not_reshaped() -> None:
    rows = np.ones((3, 4), dtype=FLOAT)
    assert convert(("batch", 4), rows) is rows  # the fast path: no copy, no reshape
    with pytest.raises(BadRequest, match="dimension 1 is 2, not 4"):
        convert(("batch", 4), [[1, 2], [3, 4]])  # same rank, wrong size: no reshape, as before


def test_a_scalar_for_each_of_several_none_inputs() -> None:
    names = ("sepal_length", "sepal_width", "petal_length", "petal_width")
    converter = InputConverter([TensorSpec(name, FLOAT, (None,)) for name in names])
    feeds = converter(dict(zip(names, [5.2, 3.6, 1.4, 0.3], strict=True)))
    assert {name: array.shape for name, array in feeds.items()} == dict.fromkeys(names, (1,))


def test_tensorflow_outputs_reach_post_inference_as_flat_lists() -> None:
    pytest.importorskip("tensorflow")
    from modelserve.runtimes.tensorflow import flat_values

    flat = flat_values(
        {
            "class_ids": np.array([[0], [2]], dtype=np.int64),
            "probabilities": np.array([[0.5, 0.5]], dtype=np.float32),
            "text": np.array([[b"a", b"b"]], dtype=object),
        }
    )
    assert flat == {"class_ids": [0, 2], "probabilities": [0.5, 0.5], "text": ["a", "b"]}
    assert type(flat["class_ids"][0]) is int


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int64, np.int32, np.uint8])
@pytest.mark.parametrize("value", [False, [1, 2, 3, True], [[1, 2], [False, 4]], [[True, False]]])
def test_json_booleans_are_not_numbers(dtype: Any, value: Any) -> None:
    converter = InputConverter([TensorSpec("input", np.dtype(dtype), (None, None))])
    with pytest.raises(BadRequest, match="input 'input'.*true or false, which is not a number"):
        converter({"input": value})


def test_bool_inputs_take_booleans_and_numeric_ones_take_numbers() -> None:
    assert InputConverter([TensorSpec("b", np.dtype(np.bool_), (None,))])({"b": [True, False]})["b"].tolist() == [
        True,
        False,
    ]
    assert convert((None,), [0, 1.5]).tolist() == [0.0, 1.5]
    rows = np.array([True, False])  # an array a pre_inference hook made is converted as it is
    assert convert((None,), rows).tolist() == [1.0, 0.0]


def test_an_empty_object_names_the_missing_input() -> None:
    with pytest.raises(BadRequest, match="missing input 'input'"):
        convert(("batch", 4), {})


@pytest.mark.parametrize(
    ("data", "found"),
    [
        ([], False),
        ([[]], False),
        ([1, 2.5], False),
        ([[1], [True]], True),
        (True, True),
        (0, False),
        ([[[0, 1]]], False),
    ],
)
def test_holds_bool(data: Any, found: bool) -> None:
    from modelserve.runtimes._tensors import holds_bool

    assert holds_bool(data) is found


@pytest.mark.parametrize("size", [4, 300, 5000])
def test_booleans_are_found_in_large_values_too(size: int) -> None:
    from modelserve.runtimes._tensors import booleans_in

    values = [[0.5 + i for i in range(size)] for _ in range(2)]
    assert not booleans_in(values, np.asarray(values, dtype=np.float32))
    values[1][size // 2] = 1  # a one is a number, not a boolean
    assert not booleans_in(values, np.asarray(values, dtype=np.float32))
    values[1][-1] = True
    assert booleans_in(values, np.asarray(values, dtype=np.float32))
    with pytest.raises(BadRequest, match="true or false"):
        convert((None, None), values)
