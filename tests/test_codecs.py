"""Payload codecs: request bodies by Content-Type, results by Python type."""

from __future__ import annotations

import decimal
from typing import Any

import numpy as np
import pytest

from modelserve.codecs import (
    BYTES_TYPE,
    JSON_TYPE,
    TEXT_TYPE,
    EncodeError,
    decode_payload,
    encode_result,
    parse_content_type,
    release_in_pieces,
)
from modelserve.errors import BadRequest


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/vnd.api+json",
        "application/problem+json; charset=utf-8",
    ],
)
def test_json_and_plus_json_types_are_parsed(content_type: str) -> None:
    assert decode_payload(content_type, b'{"a": [1, 2.5, null, true]}') == {"a": [1, 2.5, None, True]}


@pytest.mark.parametrize(
    ("content_type", "body", "expected"),
    [
        ("text/plain", "héllo".encode(), "héllo"),
        ("text/plain; charset=utf-8", "héllo".encode(), "héllo"),
        ("text/plain; charset=latin-1", "héllo".encode("latin-1"), "héllo"),
        ('text/plain; charset="ISO-8859-1"', "héllo".encode("latin-1"), "héllo"),
        ("text/plain;charset=utf-16", "héllo".encode("utf-16"), "héllo"),
        ("text/plain; format=flowed; charset=cp1252", "€5".encode("cp1252"), "€5"),
    ],
)
def test_text_is_decoded_with_its_charset(content_type: str, body: bytes, expected: str) -> None:
    assert decode_payload(content_type, body) == expected


@pytest.mark.parametrize(
    "content_type",
    [None, "", "application/octet-stream", "image/png", "text/html", "multipart/form-data; boundary=x"],
)
def test_other_or_missing_types_give_the_raw_bytes(content_type: str | None) -> None:
    body = b"\x00\xff raw {"
    decoded = decode_payload(content_type, body)
    assert decoded == body and isinstance(decoded, bytes)


@pytest.mark.parametrize(
    ("content_type", "body", "message"),
    [
        ("application/json", b"{not json", "request body is not valid JSON"),
        ("application/json", b"", "request body is not valid JSON"),
        ("application/ld+json", b"[1,", "request body is not valid JSON"),
        ("text/plain; charset=klingon", b"abc", "unknown charset 'klingon'"),
        ("text/plain", b"\xff\xfe\xfa", "request body is not valid utf-8 text"),
        ("text/plain; charset=ascii", "é".encode(), "request body is not valid ascii text"),
    ],
)
def test_undecodable_payloads_are_400(content_type: str, body: bytes, message: str) -> None:
    with pytest.raises(BadRequest) as caught:
        decode_payload(content_type, body)
    assert caught.value.status_code == 400
    assert message in caught.value.message


def test_parse_content_type() -> None:
    parsed = parse_content_type('Text/Plain; Charset="latin-1"; x=y')
    assert parsed == ("text/plain", {"charset": "latin-1", "x": "y"})
    assert parse_content_type(None) == ("", {})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"a": 1}, b'{"a":1}'),
        ([1, "two", None], b'[1,"two",null]'),
        ((1, 2), b"[1,2]"),
        (3, b"3"),
        (2.5, b"2.5"),
        (True, b"true"),
        (None, b"null"),
        ({1: "int keys"}, b'{"1":"int keys"}'),
    ],
)
def test_plain_values_are_json(value: object, expected: bytes) -> None:
    assert encode_result(value) == (expected, JSON_TYPE)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (np.array([[1, 2], [3, 4]], dtype=np.int64), [[1, 2], [3, 4]]),
        (np.array([0.5, 1.5], dtype=np.float32), [0.5, 1.5]),
        (np.arange(6).reshape(2, 3)[:, 1], [1, 4]),  # a non-contiguous view
        (np.array([True, False]), [True, False]),
        (np.array(["a", "b"]), ["a", "b"]),  # a unicode array orjson does not know
        (np.array([1, "x"], dtype=object), [1, "x"]),
        (np.float32(0.25), 0.25),
        (np.int64(7), 7),
        (np.bool_(True), True),
        ({"scores": np.array([0.1, 0.9]), "label": np.int32(1)}, {"scores": [0.1, 0.9], "label": 1}),
    ],
)
def test_numpy_arrays_and_scalars_become_lists_and_numbers(value: object, expected: object) -> None:
    import orjson

    body, content_type = encode_result(value)
    assert content_type == JSON_TYPE
    assert orjson.loads(body) == expected


def test_str_is_json_and_bytes_are_octet_stream() -> None:
    # A str is JSON, as Truss and Cortex answered: "iris-setosa" with its quotes.
    assert encode_result("iris-setosa") == (b'"iris-setosa"', JSON_TYPE)
    assert encode_result("héllo") == ('"héllo"'.encode(), JSON_TYPE)
    assert encode_result('{"a": 1}') == (b'"{\\"a\\": 1}"', JSON_TYPE)  # a str holding JSON stays a str
    assert TEXT_TYPE == b"text/plain; charset=utf-8"  # streams' str chunks
    assert encode_result(b"\x00\x01") == (b"\x00\x01", BYTES_TYPE)
    assert encode_result(bytearray(b"ab")) == (b"ab", BYTES_TYPE)
    assert encode_result(memoryview(b"ab")) == (b"ab", BYTES_TYPE)


def test_pydantic_models_are_encoded_with_their_own_json() -> None:
    import pydantic

    class Point(pydantic.BaseModel):
        x: int
        when: decimal.Decimal

    body, content_type = encode_result({"points": [Point(x=1, when=decimal.Decimal("1.5"))]})
    assert (body, content_type) == (b'{"points":[{"x":1,"when":"1.5"}]}', JSON_TYPE)
    assert encode_result(Point(x=2, when=decimal.Decimal(0)))[0] == b'{"x":2,"when":"0"}'


def test_encoding_never_imports_pydantic() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from modelserve.codecs import encode_result; encode_result({'a': 'b'}); encode_result('s'); "
        "assert 'pydantic' not in sys.modules, 'pydantic was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


class Opaque:
    pass


@pytest.mark.parametrize(
    ("value", "type_name"),
    [
        (Opaque(), "Opaque"),
        ({"nested": [Opaque()]}, "Opaque"),
        ({1, 2}, "set"),
        (decimal.Decimal("1.5"), "Decimal"),
    ],
)
def test_unknown_types_name_the_type(value: object, type_name: str) -> None:
    with pytest.raises(EncodeError) as caught:
        encode_result(value)
    assert type_name in str(caught.value)
    assert "cannot encode a result of type" in str(caught.value)


# ------------------------------------------------------------------------------------------------
# release_in_pieces


class _Counted:
    freed = 0

    def __del__(self) -> None:
        _Counted.freed += 1


def test_release_in_pieces_frees_a_value_nobody_else_holds() -> None:
    _Counted.freed = 0
    box: list[Any] = [{"x": [_Counted() for _ in range(40_000)], "rows": [[_Counted()] for _ in range(3)]}]
    release_in_pieces(box.pop())
    assert _Counted.freed == 40_003


def test_release_in_pieces_leaves_what_user_code_kept_whole() -> None:
    kept_list = [0.5] * 50_000
    kept_dict = {"a": [1.0, 2.0]}
    box: list[Any] = [{"x": kept_list, "rows": [[1.0, 2.0] for _ in range(1000)], "meta": kept_dict}]
    release_in_pieces(box.pop())
    assert kept_list == [0.5] * 50_000 and kept_dict == {"a": [1.0, 2.0]}
    held = {"x": [1.0] * 10}
    release_in_pieces(held)  # the caller still holds it: left as it is
    assert held == {"x": [1.0] * 10}
