
import fastapi

class Model:
    async def websocket(self, websocket: fastapi.WebSocket):
        try:
            while True:
                text = await websocket.receive_text()
                if text == "raise":
                    raise ValueError("This is test error.")
                await websocket.send_text(text + " pong")
        except fastapi.WebSocketDisconnect:
            pass
