
from typing import AsyncGenerator

class Model:
    async def messages(self, inputs) -> AsyncGenerator[str, None]:
        for num in inputs["nums"]:
            yield num

    async def predict(self, inputs):
        pass
