"""An iris classifier: a linear model whose weights live in weights.json, next to this file.

preprocess checks the request and turns it into a feature vector, predict scores it, postprocess turns the
scores into a label and rounded probabilities.
"""

from __future__ import annotations

import json
import math

from starlette.exceptions import HTTPException


class Model:
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

    def preprocess(self, inputs):
        if not isinstance(inputs, dict):
            raise HTTPException(422, "send a JSON object with " + ", ".join(self.features))
        missing = [name for name in self.features if name not in inputs]
        if missing:
            raise HTTPException(422, "missing feature(s): " + ", ".join(missing))
        try:
            return [float(inputs[name]) for name in self.features]
        except (TypeError, ValueError):
            raise HTTPException(422, "every feature must be a number") from None

    def predict(self, features):
        logits = [
            sum(x * row[k] for x, row in zip(features, self.weights, strict=True)) + self.bias[k]
            for k in range(len(self.labels))
        ]
        top = max(logits)
        exps = [math.exp(logit - top) for logit in logits]
        total = sum(exps)
        return [e / total for e in exps]

    def postprocess(self, probabilities):
        best = max(range(len(probabilities)), key=probabilities.__getitem__)
        return {
            "label": self.labels[best],
            "probabilities": {
                label: round(p, self.decimals) for label, p in zip(self.labels, probabilities, strict=True)
            },
        }
