"""Introspection of Model classes: every accepted and refused signature, decided once at load time.

This module uses ``from __future__ import annotations``: every annotation below is a string that
introspection must resolve before it can tell a Request from anything else.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import pytest
from starlette.requests import Request

from modelserve.backends.model_class import check_constructor
from modelserve.errors import LoadError
from modelserve.introspect import ModelSpec, inspect_model_class, is_request_annotation, select_kwargs
from modelserve.project import import_file
from tests.conftest import write_project


class FastRequest(Request):
    """What fastapi.Request is: a subclass of starlette's Request (fastapi itself is not needed)."""


def spec_of(cls: type) -> ModelSpec:
    return inspect_model_class(cls, "model.py:" + cls.__name__)


def forms(spec: ModelSpec) -> dict[str, tuple[bool, bool, bool]]:
    """{stage: (takes_inputs, takes_request, is_async)}"""
    return {s.name: (s.takes_inputs, s.takes_request, s.is_async) for s in spec.stages}


def refusal(cls: type) -> str:
    with pytest.raises(LoadError) as caught:
        spec_of(cls)
    return str(caught.value)


# --------------------------------------------------------------------------------------------------
# accepted


class InputsOnly:
    def predict(self, inputs):
        return inputs


class InputsAndRequest:
    def predict(self, inputs, request: Request):
        return inputs


class RequestOnly:
    async def predict(self, request: Request):
        return await request.body()


class FastApiStyle:
    async def predict(self, inputs, request: FastRequest):
        return inputs


class OptionalRequest:
    def predict(self, inputs, request: Request | None = None):
        return inputs


class TypingOptionalRequest:
    def predict(self, inputs, request: typing.Optional[Request]):  # noqa: UP045 - the old spelling on purpose
        return inputs


class AllStages:
    def preprocess(self, inputs, request: Request):
        return inputs

    async def predict(self, inputs):
        return inputs

    def postprocess(self, outputs, request: Request):
        return outputs


class RequestOnlyPreprocess:
    def preprocess(self, request: Request):
        return request.headers.get("x-user")

    def predict(self, user):
        return user


class AnnotatedInputs:
    def predict(self, inputs: dict[str, Any], request: Request) -> dict[str, Any]:
        return inputs


class WithVarArgs:
    def predict(self, inputs, *args, **kwargs):
        return inputs


class Static:
    @staticmethod
    def predict(inputs):
        return inputs


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        (InputsOnly, {"predict": (True, False, False)}),
        (InputsAndRequest, {"predict": (True, True, False)}),
        (RequestOnly, {"predict": (False, True, True)}),
        (FastApiStyle, {"predict": (True, True, True)}),
        (OptionalRequest, {"predict": (True, True, False)}),
        (TypingOptionalRequest, {"predict": (True, True, False)}),
        (
            AllStages,
            {"preprocess": (True, True, False), "predict": (True, False, True), "postprocess": (True, True, False)},
        ),
        (RequestOnlyPreprocess, {"preprocess": (False, True, False), "predict": (True, False, False)}),
        (AnnotatedInputs, {"predict": (True, True, False)}),
        (WithVarArgs, {"predict": (True, False, False)}),
        (Static, {"predict": (True, False, False)}),
    ],
)
def test_accepted_signatures(cls: type, expected: dict[str, tuple[bool, bool, bool]]) -> None:
    spec = spec_of(cls)
    assert forms(spec) == expected
    assert [stage.name for stage in spec.stages] == [
        name for name in ("preprocess", "predict", "postprocess") if name in expected
    ]


def test_the_body_is_needed_only_when_a_stage_takes_inputs() -> None:
    assert spec_of(RequestOnly).needs_inputs is False
    assert spec_of(RequestOnly).needs_request is True
    assert spec_of(InputsOnly).needs_inputs is True
    assert spec_of(InputsOnly).needs_request is False
    # preprocess(request) reads the request only, but predict takes preprocess's output: inputs are "taken"
    # by predict, so the spec says inputs are needed; what matters is that RequestOnly never parses.
    assert spec_of(RequestOnlyPreprocess).needs_request is True


class SyncLoad:
    def load(self):
        pass

    def predict(self, inputs):
        return inputs


class AsyncLoad:
    async def load(self):
        pass

    def predict(self, inputs):
        return inputs


def test_load_is_optional_sync_or_async() -> None:
    assert (spec_of(InputsOnly).has_load, spec_of(InputsOnly).load_is_async) == (False, False)
    assert (spec_of(SyncLoad).has_load, spec_of(SyncLoad).load_is_async) == (True, False)
    assert (spec_of(AsyncLoad).has_load, spec_of(AsyncLoad).load_is_async) == (True, True)


def test_string_annotations_are_resolved_in_the_user_module(tmp_path: Path) -> None:
    root = write_project(
        tmp_path / "strings",
        {
            "string_annotations.py": """
                from __future__ import annotations

                from starlette.requests import Request as StarletteRequest


                class Model:
                    def preprocess(self, inputs, request: StarletteRequest):
                        return inputs

                    async def predict(self, request: StarletteRequest):
                        return None

                    def postprocess(self, outputs, request: StarletteRequest | None):
                        return outputs
            """
        },
    )
    cls = import_file(root, "string_annotations.py").Model
    refused = refusal(cls)  # predict(request) alone discards preprocess's output
    assert "Model.predict(self, request: 'StarletteRequest')" in refused
    del cls.preprocess
    assert forms(spec_of(cls)) == {"predict": (False, True, True), "postprocess": (True, True, False)}


def test_an_unresolvable_request_annotation_is_explained(tmp_path: Path) -> None:
    root = write_project(
        tmp_path / "unresolved",
        {
            "type_checking.py": """
                from __future__ import annotations

                from typing import TYPE_CHECKING

                if TYPE_CHECKING:
                    from starlette.requests import Request


                class Model:
                    def predict(self, inputs, request: Request):
                        return inputs
            """
        },
    )
    message = refusal(import_file(root, "type_checking.py").Model)
    assert "Model.predict(self, inputs, request: 'Request')" in message
    assert "could not be resolved" in message and "import Request" in message


def test_is_request_annotation() -> None:
    assert is_request_annotation(Request)
    assert is_request_annotation(FastRequest)
    assert is_request_annotation(Request | None)
    assert not is_request_annotation(dict)
    assert not is_request_annotation("Request")
    assert not is_request_annotation(list[Request])


# --------------------------------------------------------------------------------------------------
# refused


class RequestFirst:
    def predict(self, request: Request, inputs):
        return inputs


class SecondNotARequest:
    def predict(self, inputs, options):
        return inputs


class SecondWrongType:
    def predict(self, inputs, request: dict):
        return inputs


class ThreeParameters:
    def predict(self, inputs, request: Request, extra):
        return inputs


class NoParameter:
    def predict(self):
        return None


class PostprocessRequestOnly:
    def predict(self, inputs):
        return inputs

    def postprocess(self, request: Request):
        return None


class PredictRequestOnlyWithPreprocess:
    def preprocess(self, inputs):
        return inputs

    def predict(self, request: Request):
        return None


class NoPredict:
    def preprocess(self, inputs):
        return inputs


class GeneratorPreprocess:
    def preprocess(self, inputs):
        yield inputs

    def predict(self, inputs):
        return inputs


class StreamingPredictWithPostprocess:
    async def predict(self, inputs):
        yield inputs

    def postprocess(self, outputs):
        return outputs


class PredictNotCallable:
    predict = 42


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        (RequestFirst, "RequestFirst.predict(self, request: 'Request', inputs): the request must come second"),
        (
            SecondNotARequest,
            "SecondNotARequest.predict(self, inputs, options): the second argument 'options' must be annotated as a "
            "Request",
        ),
        (SecondWrongType, "SecondWrongType.predict(self, inputs, request: 'dict'): the second argument 'request'"),
        (
            ThreeParameters,
            "ThreeParameters.predict(self, inputs, request: 'Request', extra): takes 3 arguments, at most 2",
        ),
        (NoParameter, "NoParameter.predict(self): takes no argument"),
        (
            PostprocessRequestOnly,
            "PostprocessRequestOnly.postprocess(self, request: 'Request'): takes only the request, so predict's "
            "output would be lost",
        ),
        (
            PredictRequestOnlyWithPreprocess,
            "PredictRequestOnlyWithPreprocess.predict(self, request: 'Request'): takes only the request while "
            "preprocess is defined",
        ),
        (NoPredict, "NoPredict has no predict method"),
        (PredictNotCallable, "PredictNotCallable has no predict method"),
        (StreamingPredictWithPostprocess, "StreamingPredictWithPostprocess.predict streams"),
    ],
)
def test_refused_signatures(cls: type, expected: str) -> None:
    message = refusal(cls)
    assert message.startswith(f"model.py:{cls.__name__}: class {cls.__name__} cannot be served:")
    assert expected in message


class GeneratorPostprocess:
    def predict(self, inputs):
        return inputs

    async def postprocess(self, outputs):
        for item in outputs:
            yield item


@pytest.mark.parametrize(
    ("cls", "stage", "generator"),
    [(GeneratorPreprocess, "preprocess", "sync"), (GeneratorPostprocess, "postprocess", "async")],
)
def test_generator_preprocess_and_postprocess_are_accepted(cls: type, stage: str, generator: str) -> None:
    # As in Truss: a generator postprocess streams predict's whole result; a generator preprocess feeds predict.
    spec = spec_of(cls).stage(stage)
    assert spec is not None and spec.generator == generator


@pytest.mark.parametrize("cls", [RequestFirst, SecondNotARequest, ThreeParameters, NoParameter])
def test_signature_refusals_show_the_accepted_forms(cls: type) -> None:
    assert "accepted forms: (inputs), (inputs, request: Request) or (request: Request)" in refusal(cls)


class EverythingWrong:
    def preprocess(self, request: Request, inputs):
        return inputs

    def predict(self, a, b, c):
        return a

    def postprocess(self, request: Request):
        return None


def test_all_problems_are_reported_in_one_error() -> None:
    message = refusal(EverythingWrong)
    problems = [line for line in message.splitlines() if line.startswith("  - ")]
    assert len(problems) == 3, message
    assert "EverythingWrong.preprocess(self, request: 'Request', inputs): the request must come second" in message
    assert "EverythingWrong.predict(self, a, b, c): takes 3 arguments" in message
    assert "EverythingWrong.postprocess(self, request: 'Request'): takes only the request" in message


def test_a_non_class_is_refused() -> None:
    with pytest.raises(LoadError, match="is not a class"):
        inspect_model_class(InputsOnly(), "model.py:Model")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# constructors: pass only what __init__ names


class NoInit:
    pass


class ConfigOnly:
    def __init__(self, config):
        pass


class MetricsOnly:
    def __init__(self, metrics_client):
        pass


class Both:
    def __init__(self, config, metrics_client=None):
        pass


class Kwargs:
    def __init__(self, **kwargs):
        pass


class NeedsSecret:
    def __init__(self, config, secret):
        pass


AVAILABLE = {"config": {"a": 1}, "metrics_client": object()}


@pytest.mark.parametrize(
    ("cls", "names"),
    [
        (ConfigOnly, {"config"}),
        (MetricsOnly, {"metrics_client"}),
        (Both, {"config", "metrics_client"}),
        (Kwargs, {"config", "metrics_client"}),
    ],
)
def test_constructors_get_only_what_they_name(cls: type, names: set[str]) -> None:
    check_constructor(cls, "model.py:" + cls.__name__)
    assert set(select_kwargs(cls.__init__, AVAILABLE)) == names  # type: ignore[misc]


def test_a_class_without_init_is_accepted() -> None:
    check_constructor(NoInit, "model.py:NoInit")


def test_a_constructor_requiring_something_else_is_refused() -> None:
    with pytest.raises(LoadError) as caught:
        check_constructor(NeedsSecret, "model.py:NeedsSecret")
    message = str(caught.value)
    assert "model.py:NeedsSecret" in message and "NeedsSecret.__init__(self, config, secret)" in message
    assert "['secret']" in message and "config, data_dir, secrets" in message
