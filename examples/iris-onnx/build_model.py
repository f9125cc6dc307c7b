"""Write model.onnx: a fixed linear iris classifier built with the onnx helper API.

The classifier is a nearest-centroid rule written as a linear layer: for each species k, with mu_k the mean
measurements of its flowers in Fisher's iris data, score_k = x . mu_k - |mu_k|^2 / 2 (the flower is closest
to the species with the highest score). No training, no data file: the means are below.

    python build_model.py [OUTPUT]        # default: model.onnx next to this script

Input ``input`` float32 [batch, 4] (rows of sepal length, sepal width, petal length, petal width, in cm), the
shape sklearn and xgboost converters export; outputs ``label`` int64 [batch] (0 setosa, 1 versicolor,
2 virginica) and ``probabilities`` float32 [batch, 3] (a softmax of the scores).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: Mean sepal length, sepal width, petal length, petal width (cm) of each species in Fisher's iris data.
MEANS = np.array(
    [
        [5.006, 3.428, 1.462, 0.246],  # setosa
        [5.936, 2.770, 4.260, 1.326],  # versicolor
        [6.588, 2.974, 5.552, 2.026],  # virginica
    ],
    dtype=np.float32,
)
WEIGHTS = MEANS.T.copy()  # [4, 3]
BIAS = (-0.5 * (MEANS**2).sum(axis=1)).astype(np.float32)  # [3]


def build() -> onnx.ModelProto:
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["input", "weights"], ["product"]),
            helper.make_node("Add", ["product", "bias"], ["scores"]),
            helper.make_node("ArgMax", ["scores"], ["label"], axis=1, keepdims=0),
            helper.make_node("Softmax", ["scores"], ["probabilities"], axis=1),
        ],
        "iris",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 4])],
        [
            helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"]),
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 3]),
        ],
        [
            numpy_helper.from_array(WEIGHTS, "weights"),
            numpy_helper.from_array(BIAS, "bias"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="modelserve-example")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def main() -> None:
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("model.onnx")
    onnx.save(build(), str(target))
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
