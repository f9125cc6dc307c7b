"""A lexicon-based sentiment scorer, served as a Cortex-style async API.

Each word of the text found in ``lexicon.json`` adds its weight (positive words) or subtracts it (negative
ones); a negator right before a word ("not good") flips it. ``delay`` in the API's config simulates a slow
model, so that there is time to poll a job while it is ``in_progress`` and to cancel it.
"""

import json
import re
import time

WORD = re.compile(r"[a-z']+")


class Handler:
    def __init__(self, config, metrics_client):
        # The server runs in the project folder, so a relative path finds the project's files.
        with open(config.get("lexicon", "lexicon.json"), encoding="utf-8") as file:
            lexicon = json.load(file)
        self.weights = {**lexicon["positive"], **{word: -w for word, w in lexicon["negative"].items()}}
        self.negators = set(lexicon["negators"])
        self.threshold = float(config.get("threshold", 0.5))
        self.delay = float(config.get("delay", 0.0))
        self.metrics = metrics_client

    def handle_async(self, payload, request_id):
        # A plain string body (text/plain) is the text itself; JSON is {"text": ...}.
        text = payload if isinstance(payload, str) else payload.get("text") if isinstance(payload, dict) else None
        if not isinstance(text, str):
            raise ValueError('expected {"text": "..."} or a text/plain body')
        words = WORD.findall(text.lower())
        time.sleep(self.delay)  # the "model": a sync handler runs in the thread pool
        score, matched, negate = 0.0, [], False
        for word in words:
            weight = self.weights.get(word)
            if weight is not None:
                score += -weight if negate else weight
                matched.append(f"not {word}" if negate else word)
            negate = word in self.negators
        label = "positive" if score >= self.threshold else "negative" if score <= -self.threshold else "neutral"
        self.metrics.increment("sentiment_labels", tags={"label": label})
        return {"label": label, "score": score, "matched": matched, "words": len(words)}
