"""A toy text generator that streams its tokens, the way an LLM server would.

The request is a `Prompt`: modelserve validates the JSON body into it before predict runs, so a missing
prompt, a mistyped or unknown field is a 400 naming it, and the OpenAPI document (/openapi.json, /docs)
shows the fields and the `Token` of each chunk.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from pydantic import BaseModel, ConfigDict, Field

from modelserve import logger


class Prompt(BaseModel):
    """What to generate from, and how many tokens at most."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(max_length=10_000)
    max_tokens: int = Field(16, ge=1, le=256)


class Token(BaseModel):
    """One generated token and its position."""

    token: str
    index: int


class Model:
    def __init__(self, config):
        self.delay = float(config.get("seconds_per_token", 0.05))
        self.vocabulary = config.get("vocabulary", ["the", "model", "streams", "one", "token", "at", "a", "time"])

    async def predict(self, inputs: Prompt) -> AsyncIterator[Token]:
        """Yield `max_tokens` tokens; stops early (its finally runs) when the client goes away."""
        sent = 0
        try:
            for sent in range(1, inputs.max_tokens + 1):
                await asyncio.sleep(self.delay)  # the "forward pass"
                token = self.vocabulary[(len(inputs.prompt) + sent) % len(self.vocabulary)]
                yield Token(token=token, index=sent - 1)
        finally:
            logger.info("generation ended after %d of %d tokens", sent, inputs.max_tokens)
