class Model:
    def __init__(self, **kwargs):
        self._secrets = kwargs["secrets"]

    def predict(self, request):
        return self._secrets["secret"]
