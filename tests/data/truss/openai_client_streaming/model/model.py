
from typing import AsyncGenerator

class Model:
    async def chat_completions(self, inputs) -> AsyncGenerator[str, None]:
        for num in inputs["nums"]:
            yield num

    async def predict(self, inputs):
        pass
