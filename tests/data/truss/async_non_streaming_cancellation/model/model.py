
import fastapi, asyncio, logging

class Model:
    async def predict(self, inputs, request: fastapi.Request):
        logging.info("Start sleep")
        await asyncio.sleep(2)
        logging.info("done sleep, check request.")
        if await request.is_disconnected():
            logging.warning("Cancelled (before gen).")
            return
        logging.info("Not cancelled.")
        return "Done"
