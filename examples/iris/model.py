"""An iris classifier: a linear model whose weights live in weights.json, next to this file.

The request is an `IrisFeatures` (four measurements in centimetres): modelserve validates the JSON body into
it before preprocess runs, so a missing, mistyped or unknown field is a 400 naming it, and the OpenAPI
document (/openapi.json, /docs) shows the fields. preprocess turns the features into a vector, predict scores
it, postprocess returns an `IrisAnswer`: a label and rounded probabilities.
"""

from __future__ import annotations

import json
import math

from pydantic import BaseModel, ConfigDict, Field

Measurement = Field(ge=0, le=100, description="centimetres")


class IrisFeatures(BaseModel):
    """The four measurements of a flower, in centimetres."""

    model_config = ConfigDict(extra="forbid", strict=True)  # 5.2, not "5.2" or true

    sepal_length: float = Measurement
    sepal_width: float = Measurement
    petal_length: float = Measurement
    petal_width: float = Measurement


class IrisAnswer(BaseModel):
    """The most likely species and the probability of each."""

    label: str
    probabilities: dict[str, float]


class Model:
    """Classifies an iris flower from its sepal and petal measurements."""

    def __init__(self, config):
        self.weights_file = config["weights"]
        self.decimals = config.get("decimals", 4)

    def load(self):
        # modelserve runs user code with the project folder as working directory: a relative path works.
        with open(self.weights_file) as f:
            model = json.load(f)
        self.features = model["features"]
        self.labels = model["labels"]
        self.weights = model["weights"]
        self.bias = model["bias"]

    def preprocess(self, inputs: IrisFeatures) -> list[float]:
        return [getattr(inputs, name) for name in self.features]

    def predict(self, features):
        logits = [
            sum(x * row[k] for x, row in zip(features, self.weights, strict=True)) + self.bias[k]
            for k in range(len(self.labels))
        ]
        top = max(logits)
        exps = [math.exp(logit - top) for logit in logits]
        total = sum(exps)
        return [e / total for e in exps]

    def postprocess(self, probabilities) -> IrisAnswer:
        best = max(range(len(probabilities)), key=probabilities.__getitem__)
        return IrisAnswer(
            label=self.labels[best],
            probabilities={label: round(p, self.decimals) for label, p in zip(self.labels, probabilities, strict=True)},
        )
