"""Large JSON bodies parsed in pieces (modelserve._chunked_json): always orjson.loads's value or its error.

Most tests shrink the pieces to a few dozen bytes, so that small generated documents are cut in many places;
the last ones parse 10 MiB bodies with the real sizes, through `decode_payload`, and spy on orjson.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

from modelserve import _chunked_json, codecs
from modelserve.codecs import decode_payload
from modelserve.errors import BadRequest


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_chunked_json, "PIECE", 32)
    monkeypatch.setattr(_chunked_json, "PROBE", 4)
    monkeypatch.setattr(_chunked_json, "STRIDE", 8)
    monkeypatch.setattr(_chunked_json, "_SLACK", 64)


def typed(value: Any) -> Any:
    """The value with every type spelled out: 1, 1.0 and True differ, and so do 0.0 and -0.0."""
    if isinstance(value, dict):
        return ("dict", [(key, typed(item)) for key, item in value.items()])
    if isinstance(value, list):
        return ("list", [typed(item) for item in value])
    return (type(value).__name__, repr(value))


def outcome(parse: Callable[[bytes], Any], body: bytes) -> Any:
    try:
        return typed(parse(body))
    except orjson.JSONDecodeError as exc:
        return ("error", str(exc))


def assert_same_as_orjson(body: bytes) -> None:
    assert outcome(_chunked_json.loads, body) == outcome(orjson.loads, body)


def assert_split(body: bytes) -> None:
    """Parsed in pieces (not given up for the whole-body parse), to orjson's value."""
    assert typed(_chunked_json._loads_in_pieces(body)) == typed(orjson.loads(body))


# Generated documents: JSON text written with the forms and the whitespace a client may send.

NUMBERS = [
    lambda rng: str(rng.randint(0, 9)),
    lambda rng: str(rng.randint(-(10**6), 10**6)),
    lambda rng: rng.choice(["0", "-0", "0.0", "-0.0", "1E5", "1e+2", "2.5e-3", "-7E-0", "1e-400"]),
    lambda rng: repr(rng.uniform(-1e6, 1e6)),
    lambda rng: f"{rng.random():.{rng.randint(1, 17)}f}",
    lambda rng: f"{rng.uniform(-10, 10):.3e}",
    lambda rng: str(rng.choice([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**30, -(10**40)])),
]
STRINGS = [
    "",
    "plain",
    "[1,2,3]",
    "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25]",
    'quote \\" [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27]',
    "backslash \\\\[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26]",
    "\\\\",
    '\\"',
    "\\u0001",
    "\\u0001deadbeefdeadbeef:0",
    "\\u0001" + "0" * 16 + ":1",
    "héllo 漢字 😀",
    "\\ud83d\\ude00",
    "tab\\tnew\\nline",
    "[[1,2],[3,4],[5,6],[7,8],[9,10],[11,12],[13,14],[15,16],[17,18],[19,20],[21,22]]",
]
SPACES = ["", "", "", "", " ", "  ", "\n", "\n    ", "\t", "\r\n"]


def space(rng: random.Random) -> str:
    return rng.choice(SPACES)


def number(rng: random.Random) -> str:
    return rng.choice(NUMBERS)(rng)


def numbers(rng: random.Random, count: int) -> str:
    return "[" + space(rng) + f"{space(rng)},{space(rng)}".join(number(rng) for _ in range(count)) + space(rng) + "]"


def tensor(rng: random.Random, shape: list[int]) -> str:
    if len(shape) == 1:
        return numbers(rng, shape[0])
    rows = (tensor(rng, shape[1:]) for _ in range(shape[0]))
    return "[" + space(rng) + f"{space(rng)},{space(rng)}".join(rows) + space(rng) + "]"


def value(rng: random.Random, depth: int = 0) -> str:
    kind = rng.choice(["number", "string", "literal", "object", "array", "numbers", "tensor", "tensor", "numbers"])
    if depth > 3 and kind in ("object", "array"):
        kind = "numbers"
    if kind == "number":
        return number(rng)
    if kind == "string":
        return '"' + rng.choice(STRINGS) + '"'
    if kind == "literal":
        return rng.choice(["true", "false", "null"])
    if kind == "object":
        members = (f'"{rng.choice(STRINGS)}"{space(rng)}:{space(rng)}{value(rng, depth + 1)}' for _ in range(3))
        return "{" + space(rng) + f",{space(rng)}".join(members) + space(rng) + "}"
    if kind == "array":  # of anything: numbers next to strings, objects, empty arrays
        items = [value(rng, depth + 1) for _ in range(rng.randint(0, 4))] + ["[]"] * rng.randint(0, 1)
        rng.shuffle(items)
        return "[" + f",{space(rng)}".join(items) + "]"
    if kind == "numbers":
        return numbers(rng, rng.randint(0, 60))
    return tensor(rng, [rng.randint(1, 6) for _ in range(rng.randint(2, 4))])


def document(rng: random.Random) -> bytes:
    return (space(rng) + value(rng) + space(rng)).encode()


def mutated(rng: random.Random, body: bytes) -> bytes:
    """One byte deleted, inserted or replaced: often invalid JSON, sometimes a different valid document."""
    at = rng.randrange(len(body) + 1)
    byte = rng.choice(b',[]"\\ 0-.e9:{}')
    how = rng.choice(["delete", "insert", "replace"])
    if how == "delete":
        return body[:at] + body[at + 1 :]
    if how == "insert":
        return body[:at] + bytes([byte]) + body[at:]
    return body[:at] + bytes([byte]) + body[at + 1 :]


@pytest.mark.parametrize("seed", range(8))
def test_generated_documents_give_orjsons_value_or_its_error(small_pieces: None, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(150):
        body = document(rng)
        assert_same_as_orjson(body)
        for _ in range(3):
            assert_same_as_orjson(mutated(rng, body))


@pytest.mark.parametrize(
    "body",
    [
        b"[" + b",".join(b"%d" % i for i in range(200)) + b"]",
        b'{"x": [' + b", ".join(b"0.%06d" % i for i in range(200)) + b"]}",
        b"[\n  " + b",\n  ".join(b"-%d.5e-%d" % (i, i % 9) for i in range(200)) + b"\n]\n",
        b'{"inputs": [' + b",".join(b"[5.1,3.5,1.4,0.2]" for _ in range(100)) + b'], "parameters": {"k": 3}}',
        b"[" + b", ".join(b"[" + b", ".join(b"%d" % j for j in range(40)) + b"]" for _ in range(20)) + b"]",
        b"[[[" + b"]],[[".join(b"1,2,3],[4,5,6" for _ in range(80)) + b"]]]",
        b'[{"a": ['
        + b",".join(b"1" for _ in range(300))
        + b'], "b": "x"}, {"a": ['
        + b",".join(b"2" for _ in range(300))
        + b"]}]",
        b"[" + b",".join(b"[]" for _ in range(100)) + b",[1,2,3]," + b",".join(b"[[],[[]]]" for _ in range(50)) + b"]",
        b"[1, ["
        + b",".join(b"%d" % i for i in range(300))
        + b'], "tail", ['
        + b",".join(b"7" for _ in range(100))
        + b"]]",
        b"[" + b",".join(b"%d" % (2**64 + i) for i in range(100)) + b"]",
    ],
    ids=["flat", "spaced", "pretty", "rows", "matrix", "tensor", "objects", "empty-arrays", "mixed", "big-ints"],
)
def test_numeric_arrays_of_every_shape_are_split(small_pieces: None, body: bytes) -> None:
    assert_split(body)


LONG = b",".join(b"%d" % i for i in range(300))


INVALID = {
    "trailing-comma": b"[" + LONG + b",]",
    "two-commas": b"[" + LONG + b",,1]",
    "no-comma": b"[" + LONG + b" 1]",
    "leading-zero": b"[" + LONG + b",01]",
    "bare-point": b"[" + LONG + b",.5]",
    "point-at-end": b"[" + LONG + b",1.]",
    "plus": b"[" + LONG + b",+1]",
    "infinity": b"[" + LONG + b",1e400]",
    "unclosed": b"[" + LONG,
    "closed-twice": b"[" + LONG + b"]]",
    "inner-unclosed": b"[[" + LONG + b"]",
    "comma-after-bracket": b"[[1,2]," + LONG + b",[,3]]",
    "comma-before-bracket": b"[[1,2]," + LONG + b",[3,]]",
    "no-colon": b'{"a" [' + LONG + b"]}",
    "array-as-key": b"{[" + LONG + b"]: 1}",
    "unclosed-string": b'"[' + LONG + b"]",
    "invalid-escape": b'["\\[' + LONG + b']"]',
    "byte-order-mark": b"\xef\xbb\xbf[" + LONG + b"]",
    "not-utf-8": b'["\xff", [' + LONG + b"]]",
    "trailing-text": b"[" + LONG + b"] x",
    "empty": b"",
}


@pytest.mark.parametrize("body", INVALID.values(), ids=INVALID.keys())
def test_invalid_json_raises_orjsons_error(small_pieces: None, body: bytes) -> None:
    with pytest.raises(orjson.JSONDecodeError) as expected:
        orjson.loads(body)
    with pytest.raises(orjson.JSONDecodeError) as caught:
        _chunked_json.loads(body)
    assert str(caught.value) == str(expected.value)


ODD = {
    "in-a-string": b'["[' + LONG + b']"]',
    "in-a-key": b'{"[' + LONG + b']": "[' + LONG + b']"}',
    "after-a-backslash": b'["\\\\[' + LONG + b']", [' + LONG + b"]]",
    "after-an-escaped-quote": b'["\\"[' + LONG + b']"]',
    "sentinel-like": b'["\\u0001", "\\u00010000000000000000:0", [' + LONG + b"]]",
    "deeper-than-split": b"[" * 300 + LONG + b"]" * 300,
    "top-level": b"[" + LONG + b"]",
    "nested-alone": b"[" * 3 + LONG + b"]" * 3,
}


@pytest.mark.parametrize("body", ODD.values(), ids=ODD.keys())
def test_documents_not_split_or_split_give_orjsons_value(small_pieces: None, body: bytes) -> None:
    assert_same_as_orjson(body)


def test_a_string_that_equals_the_sentinel_is_kept(small_pieces: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_chunked_json.os, "urandom", lambda size: b"\x00" * size)
    body = b'["\\u00010000000000000000:0", [' + LONG + b"]]"
    assert_same_as_orjson(body)


# The real sizes, through decode_payload.

MIB = 1024 * 1024
FLAT = ('{"x": [' + ",".join(f"0.{i % 999983:06d}" for i in range(1_150_000)) + "]}").encode()


@pytest.fixture
def orjson_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The size of every input orjson.loads is given."""
    sizes: list[int] = []
    loads = orjson.loads

    def spy(body: Any) -> Any:
        sizes.append(len(body))
        return loads(body)

    monkeypatch.setattr(orjson, "loads", spy)
    yield sizes


def matrix(rows: int, width: int) -> bytes:
    rng = random.Random(rows)
    return orjson.dumps({"inputs": [[rng.random() for _ in range(width)] for _ in range(rows)], "top_k": 3})


@pytest.mark.parametrize(
    "body",
    [
        FLAT,
        matrix(2000, 256),
        matrix(60_000, 4),
        orjson.dumps([[[1.5, -2, 3e-5]] * 224] * 224, option=orjson.OPT_INDENT_2),
    ],
    ids=["10-MiB-of-numbers", "rows-of-256", "rows-of-4", "pretty-tensor"],
)
def test_no_call_into_orjson_parses_more_than_a_piece_of_a_large_body(body: bytes, orjson_calls: list[int]) -> None:
    assert len(body) > codecs.LARGE_JSON
    value = decode_payload("application/json", body)
    sizes = list(orjson_calls)
    orjson_calls.clear()
    assert typed(value) == typed(orjson.loads(body))
    assert len(sizes) > len(body) // MIB and max(sizes) < MIB / 8, sizes


def test_the_parse_pauses_between_pieces(monkeypatch: pytest.MonkeyPatch, orjson_calls: list[int]) -> None:
    """Between two pieces it sleeps (the GIL released, for a waiting thread to take), once per WORK seconds."""
    pauses: list[float] = []
    monkeypatch.setattr(_chunked_json, "WORK", 0.0)
    monkeypatch.setattr(_chunked_json.time, "sleep", pauses.append)
    _chunked_json.loads(FLAT)
    assert len(pauses) > len(orjson_calls) > 100
    assert set(pauses) == {_chunked_json.PAUSE}


def test_an_invalid_large_body_is_a_400_with_orjsons_message() -> None:
    body = FLAT[:-2] + b",]}"
    with pytest.raises(orjson.JSONDecodeError) as expected:
        orjson.loads(body)
    with pytest.raises(BadRequest) as caught:
        decode_payload("application/json", body)
    assert caught.value.message == f"request body is not valid JSON: {expected.value}"


def test_one_large_body_is_decoded_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    inside, most = 0, 0
    lock = threading.Lock()
    loads = _chunked_json.loads

    def counted(body: bytes) -> Any:
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        try:
            return loads(body)
        finally:
            with lock:
                inside -= 1

    monkeypatch.setattr(_chunked_json, "loads", counted)
    body = FLAT[: FLAT.index(b",", 2 * MIB)] + b"]}"
    threads = [threading.Thread(target=decode_payload, args=("application/json", body)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most == 1


def test_the_event_loops_thread_does_not_wait_for_another_threads_decode() -> None:
    body = FLAT[: FLAT.index(b",", 2 * MIB)] + b"]}"
    decoded: list[Any] = []

    async def decode() -> None:
        decoded.append(decode_payload("application/json", body))

    with codecs._large_json:  # another thread's decode, as long as the test likes
        thread = threading.Thread(target=asyncio.run, args=(decode(),))
        thread.start()
        thread.join(10)
    assert decoded and len(decoded[0]["x"]) == len(orjson.loads(body)["x"])
