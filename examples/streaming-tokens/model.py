"""A toy text generator that streams its tokens, the way an LLM server would."""

from __future__ import annotations

import asyncio

from modelserve import logger


class Model:
    def __init__(self, config):
        self.delay = float(config.get("seconds_per_token", 0.05))
        self.vocabulary = config.get("vocabulary", ["the", "model", "streams", "one", "token", "at", "a", "time"])

    async def predict(self, inputs):
        """Yield `max_tokens` tokens; stops early (its finally runs) when the client goes away."""
        prompt = str(inputs.get("prompt", ""))
        max_tokens = int(inputs.get("max_tokens", 16))
        sent = 0
        try:
            for sent in range(1, max_tokens + 1):
                await asyncio.sleep(self.delay)  # the "forward pass"
                token = self.vocabulary[(len(prompt) + sent) % len(self.vocabulary)]
                yield {"token": token, "index": sent - 1}
        finally:
            logger.info("generation ended after %d of %d tokens", sent, max_tokens)
