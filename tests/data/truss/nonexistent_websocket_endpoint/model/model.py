
class Model:

    async def predict(self, inputs):
        pass
