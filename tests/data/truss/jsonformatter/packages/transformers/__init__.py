"""Stand-in for transformers (see ../README.md): from_pretrained loads nothing."""


class _Pretrained:
    def __init__(self, name, kwargs):
        self.name = name
        self.kwargs = kwargs

    @classmethod
    def from_pretrained(cls, name, **kwargs):
        return cls(name, kwargs)


class AutoModelForCausalLM(_Pretrained):
    pass


class AutoTokenizer(_Pretrained):
    pass
