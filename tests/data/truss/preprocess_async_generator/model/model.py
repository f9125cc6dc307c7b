
from typing import List, AsyncGenerator

class Model:
    async def preprocess(self, inputs) -> AsyncGenerator[str, None]:
        for num in inputs["nums"]:
            yield num

    async def predict(self, nums: AsyncGenerator[str, None]) -> List[str]:
        return [num async for num in nums]
