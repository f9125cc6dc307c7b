"""OTLP's ``ExportTraceServiceRequest`` written as protobuf bytes straight from the SDK's finished spans.

The OTLP/HTTP exporter encodes with `opentelemetry.exporter.otlp.proto.common.trace_encoder.encode_spans`,
which builds a protobuf message object per span, attribute and value before serializing them: ~36 us a stage
span and ~80 us a server span on the 2-core machine, about as much as the rest of what tracing costs a
request. `encode` writes the same message's wire format directly (~5-15 us a span), with each attribute key's
bytes made once. It is the fast path of `modelserve.tracing`'s HTTP export only: the SDK's encoder stays the
reference, `same_as_sdk` compares the two when tracing starts (the export falls back to the SDK's exporter
when they differ), and the tests compare them on every kind of span modelserve makes.

The message (opentelemetry-proto's ``trace/v1/trace.proto`` and ``common/v1/common.proto``): resource spans
(1) of a resource (1) and scope spans (2), each of a scope (1) and spans (2); a span's fields are numbered as
``_encode_span`` writes them.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

from modelserve._spans import STAGE, LiveSpan, readable

#: OpenTelemetry's span kinds (the SDK's enum values, INTERNAL 0 ... CONSUMER 4) as OTLP numbers them.
_KINDS = (1, 2, 3, 4, 5)
#: ``SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK`` and ``SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK``, as the SDK's encoder sets them.
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200
_DOUBLE = struct.Struct("<d").pack
_FIXED64 = struct.Struct("<Q").pack
_FIXED32 = struct.Struct("<I").pack
_INT64 = 0xFFFFFFFFFFFFFFFF
#: A key's encoded ``KeyValue.key`` field, made once per key (the first `_KEYS_KEPT` keys).
_keys: dict[str, bytes] = {}
_KEYS_KEPT = 4096
#: A string or int attribute's whole encoded ``KeyValue`` (the route, method, server address and port, api name
#: and status code repeat on every request): made once per pair, the first `_KEYS_KEPT` pairs.
_pairs: dict[tuple[str, str | int], bytes] = {}
#: A span name's encoded ``Span.name`` field, made once per name (the first `_KEYS_KEPT` names).
_names: dict[str, bytes] = {}
#: A stage span's lead (its field's tag and length) and its ``Span.name`` and ``Span.kind`` fields with the
#: start time's tag, by the stage's name and the length of the rest.
_stages: dict[tuple[str, int], tuple[bytes, bytes]] = {}


def _varint(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field: its tag (one byte: fields below 16), its length, its bytes."""
    size = len(payload)
    if size < 0x80:
        return bytes((tag, size)) + payload
    return bytes((tag,)) + _varint(size) + payload


def _value(value: Any) -> bytes:
    """An ``AnyValue``'s fields (a oneof: the one set is written even when it is its type's default)."""
    if type(value) is str:  # most attributes: first
        return _field(0x0A, value.encode("utf-8"))
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _field(0x0A, value.encode("utf-8"))
    if isinstance(value, int):
        return b"\x18" + _varint(value & _INT64)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE(value)
    if isinstance(value, bytes):
        return _field(0x3A, value)
    if isinstance(value, Sequence):
        return _field(0x2A, b"".join(_field(0x0A, _value(item)) for item in value))
    if isinstance(value, Mapping):
        return _field(0x32, b"".join(_field(0x0A, _key_value(str(k), v)) for k, v in value.items()))
    raise TypeError(f"an attribute value of type {type(value).__name__} has no OTLP form")


def _key_value(key: str, value: Any) -> bytes:
    if type(value) is str or type(value) is int:  # not bool: True == 1 would share 1's bytes
        pair = _pairs.get((key, value))
        if pair is None:
            pair = _key_value_made(key, value)
            if len(_pairs) < _KEYS_KEPT:  # per-request values (paths, ids) must not grow it without bound
                _pairs[(key, value)] = pair
        return pair
    return _key_value_made(key, value)


def _key_value_made(key: str, value: Any) -> bytes:
    return _key(key) + _field(0x12, _value(value))


def _key(key: str) -> bytes:
    """A ``KeyValue.key`` field."""
    encoded = _keys.get(key)
    if encoded is None:
        encoded = _field(0x0A, key.encode("utf-8"))
        if len(_keys) < _KEYS_KEPT:  # user code names keys too: the cache stays bounded
            _keys[key] = encoded
    return encoded


def _attributes(tag: int, attributes: Mapping[str, Any] | None) -> bytes:
    """Each attribute as a ``KeyValue`` field numbered by `tag` (its tag byte)."""
    if not attributes:
        return b""
    return b"".join(_field(tag, _key_value(key, value)) for key, value in attributes.items())


def _flags(context: Any) -> bytes:
    return _FIXED32(_HAS_IS_REMOTE | _IS_REMOTE if context is not None and context.is_remote else _HAS_IS_REMOTE)


def _encode_span(span: Any) -> bytes:
    context = span.get_span_context()
    parts = [b"\x0a\x10", context.trace_id.to_bytes(16, "big"), b"\x12\x08", context.span_id.to_bytes(8, "big")]
    state = context.trace_state
    if state:
        parts.append(_field(0x1A, ",".join(f"{key}={value}" for key, value in state.items()).encode("utf-8")))
    parent = span.parent
    if parent:
        parts += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
    name = span.name
    if name:
        parts.append(_name(name))
    parts += (b"\x30", _varint(_KINDS[span.kind.value]))
    if span.start_time:
        parts += (b"\x39", _FIXED64(span.start_time))
    if span.end_time:
        parts += (b"\x41", _FIXED64(span.end_time))
    parts.append(_attributes(0x4A, span.attributes))
    if span.dropped_attributes:
        parts += (b"\x50", _varint(span.dropped_attributes))
    for event in span.events:
        parts.append(_event(event))
    if span.dropped_events:
        parts += (b"\x60", _varint(span.dropped_events))
    for link in span.links:
        linked = link.context
        body = b"\x0a\x10" + linked.trace_id.to_bytes(16, "big") + b"\x12\x08" + linked.span_id.to_bytes(8, "big")
        body += _attributes(0x22, link.attributes)
        if link.dropped_attributes:
            body += b"\x28" + _varint(link.dropped_attributes)
        parts.append(_field(0x6A, body + b"\x35" + _flags(linked)))
    if span.dropped_links:
        parts += (b"\x70", _varint(span.dropped_links))
    parts += (_status(span.status), b"\x85\x01", _flags(parent))
    return b"".join(parts)


def _event(event: Any) -> bytes:
    body = b"\x09" + _FIXED64(event.timestamp) if event.timestamp else b""
    if event.name:
        body += _field(0x12, event.name.encode("utf-8"))
    body += _attributes(0x1A, event.attributes)
    if event.dropped_attributes:
        body += b"\x20" + _varint(event.dropped_attributes)
    return _field(0x5A, body)


def _status(status: Any) -> bytes:
    body = b""
    if status is not None:
        if status.description:
            body += _field(0x12, status.description.encode("utf-8"))
        if status.status_code.value:
            body += b"\x18" + _varint(status.status_code.value)
    return _field(0x7A, body)


def _name(name: str) -> bytes:
    """A ``Span.name`` field."""
    encoded = _names.get(name)
    if encoded is None:
        encoded = _field(0x2A, name.encode("utf-8"))
        if len(_names) < _KEYS_KEPT:
            _names[name] = encoded
    return encoded


#: A stage span's kind (INTERNAL) and its start time's tag; and, after its end time, its status (unset) and
#: its flags (a local parent).
_STAGE_KIND = b"\x30\x01\x39"
_STAGE_TAIL = b"\x7a\x00\x85\x01" + _FIXED32(_HAS_IS_REMOTE)
_SERVER_KIND = b"\x30" + _varint(_KINDS[1])  # SpanKind.SERVER


def _encode_live(span: LiveSpan, out: list[bytes]) -> None:
    """A `LiveSpan` and its stage spans, each as a ``ScopeSpans.spans`` field, appended to `out`."""
    trace_id = b"\x0a\x10" + span.trace_id.to_bytes(16, "big")
    span_id = span.span_id.to_bytes(8, "big")
    state = span.trace_state
    state_field = (
        _field(0x1A, ",".join(f"{key}={value}" for key, value in state.items()).encode("utf-8")) if state else b""
    )
    parts = [trace_id, b"\x12\x08", span_id, state_field]
    parent = span.parent
    if parent is not None:
        parts += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
    parts += (_name(span.name), _SERVER_KIND, b"\x39", _FIXED64(span.start_time), b"\x41", _FIXED64(span.end_time))
    head = span.head
    if head is not None:
        encoded = head.encoded
        if encoded is None:
            encoded = head.encoded = _attributes(0x4A, head.attributes)
        parts.append(encoded)
    parts.append(_set_since(span.attributes))
    if span.dropped_attributes:
        parts += (b"\x50", _varint(span.dropped_attributes))
    for event in span.events:
        parts.append(_event(event))
    parts += (_status(span.status), b"\x85\x01", _flags(parent))
    out.append(_field(0x12, b"".join(parts)))
    if not span.stages:
        return
    # A stage span: its lead (tag and length) and name are made once per stage; per span only the ids and times.
    middle = state_field + b"\x22\x08" + span_id
    size = len(trace_id) + 10 + len(middle) + 17 + len(_STAGE_TAIL)
    new_id = span.owner.span_id
    for name, seconds, end in span.stages:
        made = _stages.get((name, size))
        if made is None:
            named = _field(0x2A, (STAGE + name).encode("utf-8")) + _STAGE_KIND
            made = (b"\x12" + _varint(size + len(named)), named)
            if len(_stages) < _KEYS_KEPT:
                _stages[(name, size)] = made
        out.append(
            b"".join(
                (
                    made[0],
                    trace_id,
                    b"\x12\x08",
                    new_id().to_bytes(8, "big"),
                    middle,
                    made[1],
                    _FIXED64(end - int(seconds * 1e9)),
                    b"\x41",
                    _FIXED64(end),
                    _STAGE_TAIL,
                )
            )
        )


def _set_since(attributes: dict[str, Any]) -> bytes:
    """A server span's attributes set since it began (the request id, durations, the status code...), each
    as a ``Span.attributes`` field: a float's and a text's written directly, not kept in `_pairs` (most are
    the request's own: ids, durations)."""
    parts = []
    for key, value in attributes.items():
        kind = type(value)
        if kind is float:
            pair = _key(key) + b"\x12\x09\x21" + _DOUBLE(value)
        elif kind is str:
            pair = _key(key) + _field(0x12, _field(0x0A, value.encode("utf-8")))
        else:
            pair = _key_value(key, value)
        parts.append(_field(0x4A, pair))
    return b"".join(parts)


def encode(spans: Sequence[Any]) -> bytes:
    """The ``ExportTraceServiceRequest`` of `spans` (the SDK's `ReadableSpan`s and modelserve's `LiveSpan`s,
    each with its stages), grouped by resource and scope."""
    grouped: dict[int, tuple[Any, dict[int, tuple[Any, list[bytes]]]]] = {}
    for span in spans:
        if type(span) is LiveSpan:
            owner = span.owner
            resource, scope = owner.resource, owner.scope
            scopes = grouped.setdefault(id(resource), (resource, {}))[1]
            _encode_live(span, scopes.setdefault(id(scope), (scope, []))[1])
            continue
        resource, scope = span.resource, span.instrumentation_scope
        scopes = grouped.setdefault(id(resource), (resource, {}))[1]
        scopes.setdefault(id(scope), (scope, []))[1].append(_field(0x12, _encode_span(span)))
    out = []
    for resource, scopes in grouped.values():
        body = [_field(0x0A, _attributes(0x0A, resource.attributes if resource is not None else None))]
        for scope, encoded in scopes.values():
            head = b""
            if scope is not None:
                if scope.name:
                    head += _field(0x0A, scope.name.encode("utf-8"))
                if scope.version:
                    head += _field(0x12, scope.version.encode("utf-8"))
                head += _attributes(0x1A, scope.attributes)
            scope_spans = _field(0x0A, head) + b"".join(encoded)
            if scope is not None and scope.schema_url:
                scope_spans += _field(0x1A, scope.schema_url.encode("utf-8"))
            body.append(_field(0x12, scope_spans))
        if resource is not None and resource.schema_url:
            body.append(_field(0x1A, resource.schema_url.encode("utf-8")))
        out.append(_field(0x0A, b"".join(body)))
    return b"".join(out)


def same_as_sdk(spans: Sequence[Any]) -> bool:
    """Whether `encode` and the SDK's encoder give the same message for `spans` (as protobuf parses them; a
    `LiveSpan` as the SDK's `ReadableSpan`s of it and its stages, their span ids aside: a stage's is made when
    it is written)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    ours = ExportTraceServiceRequest()
    ours.ParseFromString(encode(spans))
    reference = encode_spans(readable(spans))
    for message in (ours, reference):
        for resource_spans in message.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                ends = {span.span_id for span in scope_spans.spans}
                for span in scope_spans.spans:
                    if span.parent_span_id in ends and span.kind == 1:  # a stage's id: made when written
                        span.span_id = b"\x00" * 8
    return bool(ours == reference)
