
from typing import List, Generator

class Model:
    async def predict(self, inputs) -> List[str]:
        nums: List[int] = inputs["nums"]
        return nums

    async def postprocess(self, nums: List[str]) -> Generator[str, None, None]:
        for num in nums:
            yield num
