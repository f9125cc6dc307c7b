"""The iris API's hooks: a JSON object of measurements in, the species' name out.

For a SavedModel, ``signature`` is the map from signature key to its SignatureDef, and ``prediction`` a dict
from output name to array.
"""

labels = ["setosa", "versicolor", "virginica"]


def pre_inference(sample, signature, metadata):
    (name,) = signature[metadata["signature_key"]].inputs  # the lone input: "measurements"
    row = [sample["sepal_length"], sample["sepal_width"], sample["petal_length"], sample["petal_width"]]
    return {name: [row]}


def post_inference(prediction, signature, metadata):
    return labels[prediction["label"][0]]
