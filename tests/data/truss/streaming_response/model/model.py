from starlette.responses import StreamingResponse
class Model:
    def predict(self, model_input):
        def text_generator():
            for i in range(3):
                yield f"data: {i}\n\n"
        return StreamingResponse(text_generator(), media_type="text/event-stream")
