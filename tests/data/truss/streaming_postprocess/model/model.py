
import time

class Model:
    def postprocess(self, response):
        for item in response:
            time.sleep(1)
            yield item + " modified"

    def predict(self, request):
        return ["0", "1"]
