"""OTLP's ``ExportTraceServiceRequest`` written as protobuf bytes straight from the SDK's finished spans.

The OTLP/HTTP exporter encodes with `opentelemetry.exporter.otlp.proto.common.trace_encoder.encode_spans`,
which builds a protobuf message object per span, attribute and value before serializing them: ~36 us a stage
span and ~80 us a server span on the 2-core machine, about as much as the rest of what tracing costs a
request. `encode` writes the same message's wire format directly, from parts made once (attribute keys and
pairs, span and stage names, a route's server span's first attributes) and fixed-size fields packed by
precompiled `struct`s: a route's server span with three stages in ~7-14 us on that machine. It is the fast
path of `modelserve.tracing`'s HTTP export only: the SDK's encoder stays the reference, `same_as_sdk` compares
the two when tracing starts (the export falls back to the SDK's exporter when they differ), and the tests
compare them on every kind of span modelserve makes.

The message (opentelemetry-proto's ``trace/v1/trace.proto`` and ``common/v1/common.proto``): resource spans
(1) of a resource (1) and scope spans (2), each of a scope (1) and spans (2); a span's fields are numbered as
``_encode_span`` writes them.
"""

from __future__ import annotations

import random
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
#: start time's tag, by the length of the rest (its ids, trace state and times) and the stage's name.
_stages: dict[int, dict[str, tuple[bytes, bytes]]] = {}
#: A resource's and a scope's encoded fields, by the object's id (with the object, held: they are immutable;
#: the first `_HELD`, a process has one or a few).
_HELD = 64
_resources: dict[int, tuple[Any, bytes]] = {}
_scopes: dict[int, tuple[Any, bytes]] = {}


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


#: A span's ``trace_id`` and ``span_id`` fields (tags 0x0A10 and 0x1208, the ids big-endian: the trace id as
#: its two halves) in one pack, with its ``parent_span_id`` field (0x2208) in `_IDS_PARENT`'s; a ``span_id``
#: or ``parent_span_id`` field alone (its tag, the id) in `_ID`'s.
_IDS = struct.Struct(">HQQHQ").pack
_IDS_PARENT = struct.Struct(">HQQHQHQ").pack
_ID = struct.Struct(">HQ").pack
_HALF = 0xFFFFFFFFFFFFFFFF
#: A server span's ``kind`` field (SERVER: 0x30 0x02, little-endian 0x0230) and its times' fields.
_SERVER_TIMES = struct.Struct("<HBQBQ").pack
#: A stage span's start time, its end time's tag and time, and its last fields: status (unset) and flags (a
#: local parent), 8 bytes written as one little-endian fixed64.
_STAGE_TIMES = struct.Struct("<QBQQ").pack
_STAGE_TAIL = int.from_bytes(b"\x7a\x00\x85\x01" + _FIXED32(_HAS_IS_REMOTE), "little")
#: A stage span's kind (INTERNAL) and its start time's tag, after its name.
_STAGE_KIND = b"\x30\x01\x39"
#: A server span's last fields when its status is unset: status, and flags (a local or remote parent).
_UNSET_TAILS = {
    False: b"\x7a\x00\x85\x01" + _FIXED32(_HAS_IS_REMOTE),
    True: b"\x7a\x00\x85\x01" + _FIXED32(_HAS_IS_REMOTE | _IS_REMOTE),
}
#: A float attribute's ``Span.attributes`` field up to its value, by key (a duration: the value is the request's).
_floats: dict[str, bytes] = {}
#: A text attribute's ``Span.attributes`` field up to the text's bytes, by key and the text's length in bytes
#: (the request id: 32 characters, new on every request).
_texts: dict[tuple[str, int], bytes] = {}
#: An int attribute's whole ``Span.attributes`` field, by key and value (the status code).
_ints: dict[tuple[str, int], bytes] = {}


def _lead(tag: int, size: int) -> bytes:
    """A length-delimited field's tag (one byte) and its length."""
    if size < 0x80:
        return bytes((tag, size))
    if size < 0x4000:
        return bytes((tag, size & 0x7F | 0x80, size >> 7))
    return bytes((tag,)) + _varint(size)


def _float_head(key: str) -> bytes:
    encoded = _key(key)
    head = _lead(0x4A, len(encoded) + 11) + encoded + b"\x12\x09\x21"
    if len(_floats) < _KEYS_KEPT:
        _floats[key] = head
    return head


def _text_head(key: str, size: int) -> bytes:
    encoded = _key(key)
    value = _lead(0x0A, size)
    any_value = _lead(0x12, len(value) + size)
    head = _lead(0x4A, len(encoded) + len(any_value) + len(value) + size) + encoded + any_value + value
    if len(_texts) < _KEYS_KEPT:  # a key with texts of every length must not grow it without bound
        _texts[(key, size)] = head
    return head


def _int_field(key: str, value: int) -> bytes:
    field = _field(0x4A, _key_value_made(key, value))
    if len(_ints) < _KEYS_KEPT:
        _ints[(key, value)] = field
    return field


def _encode_live(span: LiveSpan, out: list[bytes]) -> None:
    """A `LiveSpan` and its stage spans, each as a ``ScopeSpans.spans`` field, appended to `out` as one bytes.

    The fields of one server span's shape are written by one pack each (ids, kind and times), its first
    attributes' bytes are the `Head`'s, made once, and each attribute set since is a prefix made once per key
    (and text length) and the value's own bytes; a stage span is its name's parts, made once, around its id
    and times."""
    trace_id = span.trace_id
    high, low = trace_id >> 64, trace_id & _HALF
    span_id = span.span_id
    parent = span.parent
    state = span.trace_state
    if state:
        state_field = _field(0x1A, ",".join(f"{key}={value}" for key, value in state.items()).encode("utf-8"))
        parts = [b"", _IDS(0x0A10, high, low, 0x1208, span_id), state_field]
        if parent is not None:
            parts.append(_ID(0x2208, parent.span_id))
    elif parent is not None:
        parts = [b"", _IDS_PARENT(0x0A10, high, low, 0x1208, span_id, 0x2208, parent.span_id)]
    else:
        parts = [b"", _IDS(0x0A10, high, low, 0x1208, span_id)]
    named = _names.get(span.name)
    parts += (
        named if named is not None else _name(span.name),
        _SERVER_TIMES(0x0230, 0x39, span.start_time, 0x41, span.end_time),
    )
    head = span.head
    if head is not None:
        encoded = head.encoded
        if encoded is None:
            encoded = head.encoded = _attributes(0x4A, head.attributes)
        parts.append(encoded)
    for key, value in span.attributes.items():
        kind = type(value)
        if kind is float:
            prefix = _floats.get(key)
            parts += (prefix if prefix is not None else _float_head(key), _DOUBLE(value))
        elif kind is str:
            data = value.encode()
            prefix = _texts.get((key, len(data)))
            parts += (prefix if prefix is not None else _text_head(key, len(data)), data)
        elif kind is int:
            field = _ints.get((key, value))
            parts.append(field if field is not None else _int_field(key, value))
        else:
            parts.append(_field(0x4A, _key_value(key, value)))
    if span.dropped_attributes:
        parts += (b"\x50", _varint(span.dropped_attributes))
    for event in span.events:
        parts.append(_event(event))
    status = span.status
    if status is None:
        parts.append(_UNSET_TAILS[parent is not None and parent.is_remote])
    else:
        parts += (_status(status), b"\x85\x01", _flags(parent))
    parts[0] = _lead(0x12, sum(map(len, parts)))  # its lead, once its size is known
    stages = span.stages
    if not stages:
        out.append(b"".join(parts))
        return
    # A stage span: its lead (tag and length) and its name's fields are made once per stage and size, its ids
    # (the stage's own, the server span's as its parent) are one pack, its times and last fields another.
    size = 38 + len(state_field) + 25 if state else 63
    made_once = _stages.get(size)
    if made_once is None:
        made_once = {}
        if len(_stages) < _KEYS_KEPT:  # a few sizes: one a trace state's length
            _stages[size] = made_once
    owner = span.owner
    new_id = owner.span_id
    # A stage's id: as the owner's `span_id` draws it (0 from `bits`: the provider's own generator, or one
    # chance in 2**64 of a random 0, which the owner draws again).
    bits = random.getrandbits if owner.random_ids else _no_bits
    if state:
        parent_field = _ID(0x2208, span_id)
        for name, seconds, end in stages:
            made = made_once.get(name) or _stage(made_once, name, size)
            parts += (
                made[0],
                _IDS(0x0A10, high, low, 0x1208, bits(64) or new_id()),
                state_field,
                parent_field,
                made[1],
                _STAGE_TIMES(end - int(seconds * 1e9), 0x41, end, _STAGE_TAIL),
            )
    else:
        for name, seconds, end in stages:
            made = made_once.get(name) or _stage(made_once, name, size)
            parts += (
                made[0],
                _IDS_PARENT(0x0A10, high, low, 0x1208, bits(64) or new_id(), 0x2208, span_id),
                made[1],
                _STAGE_TIMES(end - int(seconds * 1e9), 0x41, end, _STAGE_TAIL),
            )
    out.append(b"".join(parts))  # one object a request: a batch holds few


def _no_bits(count: int) -> int:
    return 0


def _stage(made_once: dict[str, tuple[bytes, bytes]], name: str, size: int) -> tuple[bytes, bytes]:
    """A stage span's lead (its field's tag and length) and its name's and kind's fields with its start time's
    tag, where the rest of it is `size` bytes."""
    named = _field(0x2A, (STAGE + name).encode("utf-8")) + _STAGE_KIND
    made = (_lead(0x12, size + len(named)), named)
    if len(made_once) < _KEYS_KEPT:
        made_once[name] = made
    return made


def encode(spans: Sequence[Any]) -> bytes:
    """The ``ExportTraceServiceRequest`` of `spans` (the SDK's `ReadableSpan`s and modelserve's `LiveSpan`s,
    each with its stages), grouped by resource and scope."""
    grouped: dict[int, tuple[Any, dict[int, tuple[Any, list[bytes]]]]] = {}
    owner: Any = None
    live: list[bytes] = []
    for span in spans:
        if type(span) is LiveSpan:
            if span.owner is not owner:  # the spans of a batch are most often all of one provider's
                owner = span.owner
                resource, scope = owner.resource, owner.scope
                scopes = grouped.setdefault(id(resource), (resource, {}))[1]
                live = scopes.setdefault(id(scope), (scope, []))[1]
            _encode_live(span, live)
            continue
        resource, scope = span.resource, span.instrumentation_scope
        scopes = grouped.setdefault(id(resource), (resource, {}))[1]
        scopes.setdefault(id(scope), (scope, []))[1].append(_field(0x12, _encode_span(span)))
    # Each message around the spans is its lead and its own fields, sized from its parts': the spans' bytes
    # are copied once, by the one join.
    out: list[bytes] = []
    for resource, scopes in grouped.values():
        body = [_resource(resource)]
        for scope, encoded in scopes.values():
            head = _scope(scope)
            url = _field(0x1A, scope.schema_url.encode("utf-8")) if scope is not None and scope.schema_url else b""
            body += (_lead(0x12, len(head) + sum(map(len, encoded)) + len(url)), head)
            body += encoded
            body.append(url)
        if resource is not None and resource.schema_url:
            body.append(_field(0x1A, resource.schema_url.encode("utf-8")))
        out.append(_lead(0x0A, sum(map(len, body))))
        out += body
    return b"".join(out)


def _resource(resource: Any) -> bytes:
    """A ``ResourceSpans.resource`` field (made once for the first `_KEYS_KEPT` resources: immutable)."""
    made = _resources.get(id(resource))
    if made is not None and made[0] is resource:
        return made[1]
    encoded = _field(0x0A, _attributes(0x0A, resource.attributes if resource is not None else None))
    if len(_resources) < _HELD:
        _resources[id(resource)] = (resource, encoded)  # held: its id is not another's while it is here
    return encoded


def _scope(scope: Any) -> bytes:
    """A ``ScopeSpans.scope`` field (made once for the first `_KEYS_KEPT` scopes: immutable)."""
    made = _scopes.get(id(scope))
    if made is not None and made[0] is scope:
        return made[1]
    head = b""
    if scope is not None:
        if scope.name:
            head += _field(0x0A, scope.name.encode("utf-8"))
        if scope.version:
            head += _field(0x12, scope.version.encode("utf-8"))
        head += _attributes(0x1A, scope.attributes)
    encoded = _field(0x0A, head)
    if len(_scopes) < _HELD:
        _scopes[id(scope)] = (scope, encoded)
    return encoded


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
