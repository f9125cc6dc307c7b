"""The iris API's hooks: a JSON object of measurements in, the species' name out.

``pre_inference``'s annotation is what the API takes: modelserve validates the body into an `IrisFeatures`
(a missing, mistyped or unknown field is a 400 naming it) and the OpenAPI document shows its fields.
``signature`` lists the model's inputs; ``prediction`` its outputs, in order.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

labels = ["setosa", "versicolor", "virginica"]

Measurement = Field(ge=0, le=100, description="centimetres")


class IrisFeatures(BaseModel):
    """The four measurements of a flower, in centimetres."""

    model_config = ConfigDict(extra="forbid", strict=True)  # 5.2, not "5.2" or true

    sepal_length: float = Measurement
    sepal_width: float = Measurement
    petal_length: float = Measurement
    petal_width: float = Measurement


def pre_inference(sample: IrisFeatures, signature, metadata):
    return {signature[0].name: [sample.sepal_length, sample.sepal_width, sample.petal_length, sample.petal_width]}


def post_inference(prediction, signature, metadata):
    return labels[prediction[0][0]]
