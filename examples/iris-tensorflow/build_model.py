"""Write the SavedModel folder ``model/``: a fixed linear iris classifier as a tf.Module.

The same classifier as examples/iris-onnx: a nearest-centroid rule written as a linear layer. For each
species k, with mu_k the mean measurements of its flowers in Fisher's iris data, score_k = x . mu_k -
|mu_k|^2 / 2, and the flower is of the species with the highest score.

    python build_model.py [OUTPUT_DIR]     # default: model/ next to this script

Signature ``serving_default``: input ``measurements`` float32 [None, 4] (sepal length, sepal width, petal
length, petal width, in cm); outputs ``label`` int64 [None] and ``probabilities`` float32 [None, 3].
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

#: Mean sepal length, sepal width, petal length, petal width (cm) of each species in Fisher's iris data.
MEANS = np.array(
    [
        [5.006, 3.428, 1.462, 0.246],  # setosa
        [5.936, 2.770, 4.260, 1.326],  # versicolor
        [6.588, 2.974, 5.552, 2.026],  # virginica
    ],
    dtype=np.float32,
)


class Iris(tf.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weights = tf.constant(MEANS.T)
        self.bias = tf.constant(-0.5 * (MEANS**2).sum(axis=1))

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="measurements")])
    def serve(self, measurements):
        scores = tf.matmul(measurements, self.weights) + self.bias
        return {"label": tf.argmax(scores, axis=-1), "probabilities": tf.nn.softmax(scores)}


def main() -> None:
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("model")
    module = Iris()
    tf.saved_model.save(module, str(target), signatures={"serving_default": module.serve})
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
