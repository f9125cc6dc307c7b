
from typing import Optional
import logging
class Model:
    def load(self):
        logging.info(f"User Load Message")

    def predict(self, model_input):
        return self.environment_name
