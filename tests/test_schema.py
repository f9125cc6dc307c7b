"""Typed stages (modelserve/schema.py): bodies validated into the inputs' annotation, typed answers, load errors."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import httpx
import pydantic
import pytest
from typing_extensions import TypedDict

from modelserve import create_app
from modelserve.errors import LoadError
from modelserve.introspect import inspect_model_class
from tests.conftest import REPO, write_project


class Features(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    length: float
    count: int


class Answer(pydantic.BaseModel):
    label: str
    score: float


class Classifier:
    def predict(self, features: Features) -> Answer:
        return Answer(label="long" if features.length > 1 else "short", score=features.length * features.count)


class Point(TypedDict):
    x: float
    y: float


@dataclasses.dataclass
class Size:
    width: int
    height: int = 1


class Area:
    def preprocess(self, size: Size) -> int:
        return size.width * size.height

    def predict(self, area: int) -> dict[str, int]:
        return {"area": area}


class Norm:
    async def predict(self, point: Point) -> float:
        return abs(point["x"]) + abs(point["y"])


class Total:
    def predict(self, values: list[Annotated[int, pydantic.Field(ge=0)]]) -> int:
        return sum(values)


class Untyped:
    def predict(self, inputs: Any) -> Any:
        return {"type": type(inputs).__name__}


class Shout:
    def predict(self, text: str) -> Iterator[str]:
        yield text.upper()


def call(handler: type, body: Any = None, **kwargs: Any) -> httpx.Response:
    """One POST to an app serving `handler`."""

    async def run() -> httpx.Response:
        app = create_app(handler=handler, name="api")
        await app.server.wait_loaded()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client:
            if body is None:
                return await client.post("/api", **kwargs)
            return await client.post("/api", json=body)

    return asyncio.run(run())


def test_a_valid_body_is_validated_and_the_pydantic_answer_is_its_json() -> None:
    answer = call(Classifier, {"length": 2, "count": 3})
    assert answer.status_code == 200
    assert answer.json() == {"label": "long", "score": 6.0}


@pytest.mark.parametrize(
    ("body", "field", "kind"),
    [
        ({"length": 2}, "count", "missing"),
        ({"length": "long", "count": 3}, "length", "float_type"),  # strict: a string is not a number
        ({"length": 2, "count": 3, "color": "red"}, "color", "extra_forbidden"),
    ],
    ids=["missing", "wrong type", "extra field"],
)
def test_a_body_that_does_not_fit_is_a_400_naming_the_field(body: dict[str, Any], field: str, kind: str) -> None:
    answer = call(Classifier, body)
    assert answer.status_code == 400
    error = answer.json()
    assert error["error"].startswith("the inputs do not match Features: ")
    assert f"{field}: " in error["error"]
    assert error["request_id"] == answer.headers["x-request-id"]
    assert [issue["loc"] for issue in error["detail"]] == [[field]]
    assert error["detail"][0]["type"] == kind


def test_every_failing_field_is_named() -> None:
    error = call(Classifier, {"length": "x"}).json()
    assert {tuple(issue["loc"]) for issue in error["detail"]} == {("length",), ("count",)}
    assert "length: " in error["error"] and "count: Field required" in error["error"]


def test_a_body_that_is_not_json_is_the_usual_400() -> None:
    answer = call(Classifier, content=b"{nope", headers={"content-type": "application/json"})
    assert answer.status_code == 400
    assert "not valid JSON" in answer.json()["error"]


@pytest.mark.parametrize(
    ("handler", "good", "expected", "bad", "loc"),
    [
        (Area, {"width": 3, "height": 2}, {"area": 6}, {"height": 2}, ["width"]),
        (Norm, {"x": -1, "y": 2.5}, 3.5, {"x": 1, "y": "far"}, ["y"]),
        (Total, [1, 2, 3], 6, [1, -2], [1]),
    ],
    ids=["dataclass", "TypedDict", "list of constrained ints"],
)
def test_dataclasses_typeddicts_and_generic_types(
    handler: type, good: Any, expected: Any, bad: Any, loc: list[Any]
) -> None:
    assert call(handler, good).json() == expected
    refused = call(handler, bad)
    assert refused.status_code == 400
    assert refused.json()["detail"][0]["loc"] == loc


def test_a_str_input_takes_text() -> None:
    answer = call(Shout, content=b"hi there", headers={"content-type": "text/plain"})
    assert answer.status_code == 200
    assert answer.text == "HI THERE"


def test_any_is_not_validated() -> None:
    assert call(Untyped, [1, "a"]).json() == {"type": "list"}
    assert call(Untyped, content=b"raw", headers={"content-type": "application/octet-stream"}).json() == {
        "type": "bytes"
    }


def test_types_are_resolved_at_load() -> None:
    spec = inspect_model_class(Area)
    assert spec.input_type is not None and spec.input_type.annotation is Size
    assert spec.output_type is not None and spec.output_type.annotation == dict[str, int]
    streaming = inspect_model_class(Shout)
    assert streaming.output_type is not None and streaming.output_type.annotation is str  # each chunk's type
    assert inspect_model_class(Untyped).input_type is None


class Unresolved:
    def predict(self, inputs: NotDefinedAnywhere) -> None:  # type: ignore[name-defined]  # noqa: F821
        return None


class Opaque:
    def predict(self, inputs: Iterator[int]) -> int:
        return 0


class OpaqueResult:
    def predict(self, inputs: Features) -> Iterator[Features]:  # not a generator: the type of a value
        return iter(())


@pytest.mark.parametrize(
    ("handler", "expected"),
    [
        (Unresolved, "the annotation 'NotDefinedAnywhere' could not be resolved"),
        (Opaque, "pydantic cannot validate"),
        (OpaqueResult, "OpaqueResult.predict(self, inputs: 'Features') -> 'Iterator[Features]' (its result)"),
    ],
)
def test_a_type_pydantic_cannot_handle_is_a_load_error_naming_the_method(handler: type, expected: str) -> None:
    with pytest.raises(LoadError) as raised:
        create_app(handler=handler, name="api")
    assert f"{handler.__name__}.predict(" in str(raised.value)
    assert expected in str(raised.value)


def test_without_pydantic_an_annotation_asks_for_the_extra(tmp_path: Path) -> None:
    root = write_project(
        tmp_path, {"model.py": "class Model:\n    def predict(self, x: list[float]):\n        return x\n"}
    )
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["pydantic"] = None  # as if it were not installed
        import modelserve
        from modelserve.errors import MissingExtraError
        try:
            modelserve.create_app({str(root)!r})
        except MissingExtraError as exc:
            print(exc)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert 'pip install "modelserve[schema]"' in done.stdout, done.stderr


def test_a_project_without_annotations_never_imports_pydantic(tmp_path: Path) -> None:
    root = write_project(
        tmp_path, {"model.py": "class Model:\n    def predict(self, inputs):\n        return inputs\n"}
    )
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        import httpx
        import modelserve

        async def main():
            app = modelserve.create_app({str(root)!r})
            await app.server.wait_loaded()
            transport = httpx.ASGITransport(app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                assert (await client.post("/model", json={{"a": 1}})).json() == {{"a": 1}}
                assert (await client.get("/openapi.json")).status_code == 200

        asyncio.run(main())
        assert "pydantic" not in sys.modules, "pydantic was imported"
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr
