"""Stand-in for jsonformer.main (see ../README.md): a fixed value per JSON schema type."""

_VALUES = {"string": "text", "number": 1, "boolean": True}


def _fill(schema):
    kind = schema.get("type")
    if kind == "object":
        return {key: _fill(sub) for key, sub in schema.get("properties", {}).items()}
    if kind == "array":
        return [_fill(schema.get("items", {}))]
    return _VALUES.get(kind)


class Jsonformer:
    def __init__(self, model, tokenizer, json_schema, prompt, **kwargs):
        self.model = model
        self.tokenizer = tokenizer
        self.json_schema = json_schema
        self.prompt = prompt

    def __call__(self):
        result = _fill(self.json_schema)
        result["_standin"] = {"prompt": self.prompt, "model": self.model.name, "tokenizer": self.tokenizer.name}
        return result
