
class Model:
    def predict(self, request):
        raise ValueError("error")
