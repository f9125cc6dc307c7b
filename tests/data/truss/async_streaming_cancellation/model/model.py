
import fastapi, asyncio, logging

class Model:
    async def predict(self, inputs, request: fastapi.Request):
        await asyncio.sleep(1)
        if await request.is_disconnected():
            logging.warning("Cancelled (before gen).")
            return

        for i in range(5):
            await asyncio.sleep(1.0)
            logging.warning(i)
            yield str(i)
            if await request.is_disconnected():
                logging.warning("Cancelled (during gen).")
                return
