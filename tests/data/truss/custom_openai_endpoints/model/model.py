
class Model:
    def load(self):
        self._predict_count = 0
        self._completions_count = 0
        self._embeddings_count = 0
        self._messages_count = 0
        self._responses_count = 0

    async def predict(self, inputs) -> int:
        self._predict_count += inputs["increment"]
        return self._predict_count

    async def completions(self, inputs) -> int:
        self._completions_count += inputs["increment"]
        return self._completions_count

    async def embeddings(self, inputs) -> int:
        self._embeddings_count += inputs["increment"]
        return self._embeddings_count

    async def messages(self, inputs) -> int:
        self._messages_count += inputs["increment"]
        return self._messages_count

    async def responses(self, inputs) -> int:
        self._responses_count += inputs["increment"]
        return self._responses_count
