
import fastapi

class Model:
    async def websocket(self, websocket: fastapi.WebSocket):
        try:
            while True:
                text = await websocket.receive_text()
                if text == "done":
                    print("done")
                    return

                await websocket.send_text(text + " pong")
        except fastapi.WebSocketDisconnect:
            pass
