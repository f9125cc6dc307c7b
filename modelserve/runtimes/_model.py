"""The interface every runtime adapter returns: a loaded model, ready to run."""

from __future__ import annotations

from typing import Any

import numpy as np

from modelserve.runtimes._tensors import TensorSpec


class LoadedModel:
    """A model loaded by a runtime adapter.

    `run` takes the converted feeds (``{input name: array}``) and returns the runtime's prediction: for
    ONNX the list of output arrays in the model's output order, for TensorFlow a dict from output name to
    array. `pre_signature` and `post_signature` are what the pre_inference and post_inference hooks receive
    as ``signature``. `run` is thread-safe: it may be called from the event loop or from worker threads.
    """

    format = "model"
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    pre_signature: Any = None
    post_signature: Any = None

    def run(self, feeds: dict[str, np.ndarray]) -> Any:
        raise NotImplementedError

    def for_hook(self, prediction: Any) -> Any:
        """The ``prediction`` a post_inference hook receives: Cortex's form for this runtime (see the adapters)."""
        return prediction

    def as_response(self, prediction: Any) -> dict[str, Any]:
        """The answer without a post_inference hook: an object keyed by output names."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {
            "inputs": [spec.describe() for spec in self.inputs],
            "outputs": [spec.describe() for spec in self.outputs],
        }

    def close(self) -> None:
        return None
