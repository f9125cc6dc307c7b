
import time

class Model:
    def postprocess(self, response):
        updated_items = []
        for item in response:
            time.sleep(1)
            updated_items.append(item + " modified")
        return updated_items

    def predict(self, request):
        return ["0", "1"]

