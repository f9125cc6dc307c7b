
from typing import Optional
class Model:
    def __init__(self, **kwargs):
        self._config = kwargs["config"]
        self._environment = kwargs["environment"]
        self.environment_name = self._environment.get("name") if self._environment else None

    def load(self):
        print(f"Executing model.load with environment: {self.environment_name}")

    def predict(self, model_input):
        return self.environment_name
