
class Model:
    async def websocket(self, websocket):
        pass

    async def predict(self, inputs):
        pass
