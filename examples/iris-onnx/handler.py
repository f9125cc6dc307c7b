"""The iris API's hooks: a JSON object of measurements in, the species' name out."""

labels = ["setosa", "versicolor", "virginica"]


def pre_inference(sample, signature, metadata):
    return {
        signature[0].name: [
            sample["sepal_length"],
            sample["sepal_width"],
            sample["petal_length"],
            sample["petal_width"],
        ]
    }


def post_inference(prediction, signature, metadata):
    return labels[prediction[0][0]]
