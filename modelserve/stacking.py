"""Tensor batching for model files (ONNX, TensorFlow): stacking the feeds of concurrent requests into one call.

The feeds of concurrent requests are concatenated along the first dimension, the model runs once, and its
outputs are cut back by each request's row count (`FeedStacker`); `TensorBatcher` is a `batching.Batcher`
whose batched call is a `FeedStacker`. The request side (queue, batches, futures) is `batching.py`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from modelserve.batching import Batcher, Failed

if TYPE_CHECKING:
    import numpy as np

    from modelserve._threads import Adaptive, BatchThreads
    from modelserve.config import BatchingConfig
    from modelserve.pipeline import Step
    from modelserve.runtimes._tensors import TensorSpec

logger = logging.getLogger("modelserve")

#: Runs the model once on feeds (``{input name: array}``) and returns its prediction (in a batch thread).
RunFeeds = Callable[[dict[str, Any]], Any]


def has_batch_dimension(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> bool:
    """Whether requests of a model can be stacked: every input and output has a dynamic first dimension.

    A fixed first dimension (``[2, 3]``), a scalar input or an input of unknown rank means that concatenated
    feeds would not fit the model; an output with a fixed first dimension could not be cut back into rows.
    """
    for spec in inputs:
        if not spec.shape or isinstance(spec.shape[0], int):
            return False
    for spec in outputs:
        if spec.shape is not None and (not spec.shape or isinstance(spec.shape[0], int)):
            return False
    return bool(inputs)


def rows_of(feeds: dict[str, Any]) -> int | None:
    """The number of rows every input of one request shares, or None when they disagree (or are scalars)."""
    rows = None
    for array in feeds.values():
        shape = getattr(array, "shape", ())
        if not shape:
            return None
        if rows is None:
            rows = shape[0]
        elif shape[0] != rows:
            return None
    return rows


def stack_key(feeds: dict[str, Any]) -> tuple[Any, ...]:
    """Requests with equal keys can be concatenated: same inputs, dtypes and non-batch dimensions."""
    return tuple(sorted((name, array.dtype.str, array.shape[1:]) for name, array in feeds.items()))


def stack(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The feeds of several requests (of one stack key) concatenated along the first dimension."""
    import numpy as np

    return {name: np.concatenate([feeds[name] for feeds in items]) for name in items[0]}


def split_prediction(prediction: Any, rows: list[int]) -> list[Any] | None:
    """Cut a batched prediction (a list or a dict of arrays) back into one per request of `rows` rows.

    An output that is a sequence rather than an array (ONNX's ``seq(...)``: sklearn-onnx classifiers give their
    probabilities as a list of one ``{label: probability}`` map per row) is cut the same way, by its length.
    None when an output has no batch dimension (its first dimension, or its length, is not the batch's row
    count), in which case the requests must run separately.
    """
    if isinstance(prediction, dict):
        arrays = list(prediction.values())
    elif isinstance(prediction, (list, tuple)):
        arrays = list(prediction)
    else:
        return None
    total = sum(rows)
    for array in arrays:
        if isinstance(array, (list, tuple)):
            if len(array) != total:
                return None
            continue
        shape = getattr(array, "shape", ())
        if not shape or shape[0] != total:
            return None
    bounds = []
    start = 0
    for count in rows:
        bounds.append((start, start + count))
        start += count
    if isinstance(prediction, dict):
        return [{key: value[begin:end] for key, value in prediction.items()} for begin, end in bounds]
    return [[value[begin:end] for value in arrays] for begin, end in bounds]


class FeedStacker:
    """The batched call of a model file: runs a batch of per-request feeds in as few model calls as it can, in
    the batch thread that runs it (concatenating and splitting happen there too, off the event loop).

    Requests whose feeds share a `stack_key` run as one call on their concatenation; the others (different
    non-batch dimensions, inputs of unequal rows, a model without a batch dimension) run alone. Returns one
    prediction per request, or a `Failed` for a request whose call raised. A stacked call that raises is
    retried request by request, so that one bad request cannot fail the others.
    """

    def __init__(self, run: RunFeeds, *, stackable: bool, run_stacked: RunFeeds | None = None, label: str = "") -> None:
        self.run = run
        self.run_stacked = run_stacked or run
        self.stackable = stackable
        self.label = label
        #: Model calls made, calls that served more than one request, and requests served.
        self.calls = 0
        self.stacked_calls = 0
        self.requests = 0
        self._unsplittable: set[tuple[Any, ...]] = set()

    def __call__(self, items: list[dict[str, Any]]) -> list[Any]:
        self.requests += len(items)
        if not self.stackable or len(items) == 1:
            return [self._alone(feeds) for feeds in items]
        results: list[Any] = [None] * len(items)
        groups: dict[tuple[Any, ...], list[int]] = {}
        alone: list[int] = []
        for index, feeds in enumerate(items):
            if rows_of(feeds) is None:
                alone.append(index)
                continue
            key = stack_key(feeds)
            if key in self._unsplittable:
                alone.append(index)
            else:
                groups.setdefault(key, []).append(index)
        for key, indices in groups.items():
            if len(indices) == 1:
                alone.extend(indices)
                continue
            parts = self._stacked(key, [items[index] for index in indices])
            if parts is None:
                alone.extend(indices)
                continue
            for index, part in zip(indices, parts, strict=True):
                results[index] = part
        for index in sorted(alone):
            results[index] = self._alone(items[index])
        return results

    def _alone(self, feeds: dict[str, Any]) -> Any:
        self.calls += 1
        try:
            return self.run(feeds)
        except Exception as exc:
            return Failed(exc)

    def _stacked(self, key: tuple[Any, ...], group: list[dict[str, Any]]) -> list[Any] | None:
        rows = [rows_of(feeds) or 0 for feeds in group]
        self.calls += 1
        self.stacked_calls += 1
        try:
            prediction = self.run_stacked(stack(group))
        except Exception as exc:
            logger.debug(
                "%s: a stacked call of %d requests raised %r; running them one by one", self.label, len(group), exc
            )
            return None
        parts = split_prediction(prediction, rows)
        if parts is None:
            self._unsplittable.add(key)
            logger.warning(
                "%s: an output of the model has no batch dimension (its first dimension is not the number of "
                "rows); requests with inputs of this shape run one by one",
                self.label,
            )
        return parts

    def describe(self) -> dict[str, Any]:
        return {
            "stackable": self.stackable,
            "requests": self.requests,
            "model_calls": self.calls,
            "stacked_calls": self.stacked_calls,
        }


class TensorBatcher:
    """Batching for a model file: a `Batcher` whose batched call is a `FeedStacker`, run on `threads`.

    `run` runs the feeds of one request, `run_stacked` (by default `run`) the concatenated feeds of several,
    both sync, in one of the API's `threads`: the batch is handed to its thread the moment it is formed, without
    a task of its own or a loop turn between the model's calls (a batch that went through a task and an awaited
    hop per call formed batches of 5.6 requests on average for a 4x1024^2 MLP at 64 connections, 45% of its
    calls a lone request's). `execution` describes the stacked calls (``GET /<api>``).

    ::

        batcher = TensorBatcher(run_feeds, model.inputs, model.outputs, config.batching, name="mlp")
        prediction = await batcher.run(feeds)      # this request's rows of a shared call
    """

    def __init__(
        self,
        run: RunFeeds,
        inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec],
        config: BatchingConfig,
        *,
        name: str,
        run_stacked: RunFeeds | None = None,
        execution: Callable[[], dict[str, Any]] | None = None,
        max_concurrency: int = 1,
        on_batch: Callable[[int, list[float]], None] | None = None,
        threads: BatchThreads | None = None,
    ) -> None:
        self.stacker = FeedStacker(
            run, stackable=has_batch_dimension(inputs, outputs), run_stacked=run_stacked, label=f"api '{name}'"
        )
        self.execution = execution
        self.batcher = Batcher(
            sync_call=self.stacker,
            threads=threads,
            name=name,
            max_batch_size=config.max_batch_size,
            max_wait_ms=config.max_wait_ms,
            max_concurrency=max_concurrency,
            on_batch=on_batch,
        )
        #: ``await run(feeds)``: wait for the batch of `feeds` to run; its own prediction, or the exception
        #: its call raised.
        self.run: Callable[[dict[str, np.ndarray]], Awaitable[Any]] = self.batcher.submit

    def describe(self) -> dict[str, Any]:
        return {
            "max_batch_size": self.batcher.max_batch_size,
            "max_wait_ms": self.batcher.max_wait * 1000,
            "waiting": self.batcher.waiting,
            **self.stacker.describe(),
            "stacked_execution": self.execution() if self.execution is not None else None,
        }


#: A model measured faster than this per call is served unbatched (while its hooks run inline too).
#: Measured with benchmarks/serving_matrix.py on the 2-core machine: the batched path costs a request 60-130 us
#: more server time than the unbatched one (its future and queue entry, the batch's task, stacking and splitting,
#: the hooks' limits), and stacking saves at most the model's own call time per request, so on a model that
#: runs in tens of microseconds (iris, a 3x256 MLP) batching served ~0.55x the unbatched requests; a 4x1024^2 MLP
#: (2-3 ms a row) gains several times.
UNBATCHED_BELOW_S = 0.0005


class BatchChoice:
    """Whether a batched model file API serves its next request batched, or unbatched while batching would not
    pay; measured like `_threads.Adaptive`'s inline rule, from the same estimates.

    A request is served unbatched (pre_inference, the model and post_inference as one step on the event loop)
    while the model's single call is measured under `UNBATCHED_BELOW_S` and under the API's inline threshold,
    and every sync hook is measured inline: then all of it runs on the loop, one request at a time, and the
    batcher's bookkeeping would cost more than stacking saves. Otherwise batched (a model that became slower,
    a hook that went to a thread: the batched path's limits apply again). ``inline_threshold_ms: 0`` therefore
    always batches. ``GET /<api>`` shows the current mode and how many requests each served; the metrics
    time the unbatched ones' model calls as the stage "run (unbatched)".
    """

    def __init__(self, run: Adaptive, hooks: Sequence[Adaptive], below_s: float = UNBATCHED_BELOW_S) -> None:
        self.run = run
        self.hooks = tuple(hooks)
        self.below = min(below_s, run.threshold)
        self.unbatched_requests = 0
        self.batched_requests = 0

    def unbatched(self) -> bool:
        estimate = self.run.estimate
        if estimate is None or estimate >= self.below:
            return False
        for hook in self.hooks:
            hook_estimate = hook.estimate
            if hook_estimate is None or hook_estimate >= hook.threshold:
                return False
        return True

    def step(
        self, unbatched: Step, batched: Step, busy: Step | None = None, occupied: Callable[[], bool] | None = None
    ) -> Step:
        """The step that runs each request with `unbatched` or `batched`, as `unbatched()` says at its start; an
        unbatched request of a busy server with `busy` (the same call in the API's own thread) when given. Busy,
        as `Api.call` has it for an unbatched API: other requests were read after this one (``ctx.crowded``),
        or `occupied()` says the API's threads have work (a request or a batch) not finished. A request that
        found them working and ran on the event loop instead would share the core with them: both calls
        slowed, and the loop's call, timed as the model's own, measured the threads' turns too (under load on
        one core, iris's run measured 0.06-0.54 ms against 0.036 ms alone, and each estimate over
        `UNBATCHED_BELOW_S` sent requests to the batched path for a while)."""

        def choose(value: Any, request: Any, ctx: Any) -> Awaitable[Any]:
            if self.unbatched():
                self.unbatched_requests += 1
                if busy is not None and ctx is not None and (ctx.crowded or (occupied is not None and occupied())):
                    return busy(value, request, ctx)
                return unbatched(value, request, ctx)
            self.batched_requests += 1
            return batched(value, request, ctx)

        return choose

    def describe(self) -> dict[str, Any]:
        return {
            "mode": "unbatched" if self.unbatched() else "batched",
            "unbatched_below_ms": self.below * 1000,
            "unbatched_requests": self.unbatched_requests,
            "batched_requests": self.batched_requests,
        }
