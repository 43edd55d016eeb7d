"""The field readers every wire message goes through: JSON's types, no bool for a number, bounds at their
edges, the schema number, the size of a payload, and a writer that never emits NaN."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from edgecore.errors import ProtocolError
from edgecore.protocol.schema import SCHEMA_VERSION, Fields, decode_json, encode_json

MAX_JSON_BYTES = 1024 * 1024  # written out: a test of the module's own constant would move with it


def fields(**data: Any) -> Fields:
    return Fields(data, "msg")


def test_a_payload_is_a_schema_1_json_object_of_at_most_1_mib() -> None:
    assert decode_json(b'{"schema": 1, "a": 2}', "msg").data == {"schema": 1, "a": 2}
    body = b'{"schema": 1}'
    at_limit = body[:-1] + b" " * (MAX_JSON_BYTES - len(body)) + b"}"
    assert decode_json(at_limit, "msg").data == {"schema": 1}
    too_big = f"msg: payload of {MAX_JSON_BYTES + 1} bytes exceeds the {MAX_JSON_BYTES} byte limit"
    with pytest.raises(ProtocolError, match=too_big):
        decode_json(at_limit + b" ", "msg")
    assert decode_json(b'{"schema": 1' + b" " * 90 + b"}", "msg", max_bytes=103).data == {"schema": 1}


@pytest.mark.parametrize(("raw", "refusal"), [
    (b"{", "msg: malformed JSON"), (b"\xff", "msg: malformed JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "msg: JSON nested too deeply"),
    (b"[]", "msg: expected a JSON object, got list"), (b'"x"', "msg: expected a JSON object, got str"),
    (b"{}", "msg: missing field 'schema'"), (b'{"schema": 2}', "msg: unsupported schema version 2"),
    (b'{"schema": 0}', "msg: unsupported schema version 0"), (b'{"schema": true}', "msg.schema: expected int, got bool"),
    (b'{"schema": "1"}', "msg.schema: expected int, got str"),
])
def test_what_is_not_a_schema_1_object_is_refused(raw: bytes, refusal: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        decode_json(raw, "msg")
    assert str(caught.value).startswith(refusal)


def test_the_writer_adds_the_schema_and_never_writes_nan() -> None:
    assert json.loads(encode_json({"a": 1})) == {"schema": SCHEMA_VERSION, "a": 1}
    assert encode_json({"a": 1}) == b'{"schema":1,"a":1}'
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError):
            encode_json({"a": bad})


def test_text_is_read_up_to_its_limit() -> None:
    assert fields(a="x" * 8).text("a", 8) == "x" * 8 and fields(a="").text("a") == ""
    assert fields(a="x" * 1024).text("a") == "x" * 1024
    with pytest.raises(ProtocolError, match=r"msg\.a: longer than 8 characters"):
        fields(a="x" * 9).text("a", 8)
    with pytest.raises(ProtocolError, match="longer than 1024"):
        fields(a="x" * 1025).text("a")
    assert fields().opt_text("a") is None and fields(a=None).opt_text("a") is None and fields(a="y").opt_text("a") == "y"
    with pytest.raises(ProtocolError, match="longer than 2"):
        fields(a="xyz").opt_text("a", 2)
    assert fields(a="x" * 1024).opt_text("a") == "x" * 1024
    with pytest.raises(ProtocolError, match="longer than 1024"):
        fields(a="x" * 1025).opt_text("a")


def test_integers_are_ints_within_bounds_never_bools() -> None:
    assert fields(a=0).integer("a") == 0 and fields(a=2**63 - 1).integer("a") == 2**63 - 1
    assert fields(a=5).integer("a", 5, 5) == 5
    for value, bounds in ((-1, ()), (2**63, ()), (4, (5, 9)), (10, (5, 9))):
        with pytest.raises(ProtocolError, match=r"msg\.a: .* is outside"):
            fields(a=value).integer("a", *bounds)
    for wrong in (True, 1.0, "1", [1]):
        with pytest.raises(ProtocolError, match=r"msg\.a: expected int"):
            fields(a=wrong).integer("a")
    assert fields().opt_integer("a") is None and fields(a=3).opt_integer("a", 1, 3) == 3
    assert fields(a=0).opt_integer("a") == 0 and fields(a=2**63 - 1).opt_integer("a") == 2**63 - 1
    for outside in (-1, 2**63):
        with pytest.raises(ProtocolError, match="is outside"):
            fields(a=outside).opt_integer("a")
    with pytest.raises(ProtocolError):
        fields(a=4).opt_integer("a", 1, 3)


def test_numbers_are_finite_ints_or_floats_never_bools() -> None:
    assert fields(a=1).number("a") == 1.0 and fields(a=-2.5).number("a") == -2.5
    assert fields(a=2**1023).number("a") == float(2**1023)
    for value in (2**1023 + 1, -(2**1024), math.nan, math.inf, -math.inf):
        with pytest.raises(ProtocolError, match=r"msg\.a: not a finite number"):
            fields(a=value).number("a")
    others: tuple[object, ...] = (True, "1", [1], {})
    for other in others:
        with pytest.raises(ProtocolError, match=r"msg\.a: expected int or float"):
            fields(a=other).number("a")
    assert fields().opt_number("a") is None and fields(a=2).opt_number("a") == 2.0


@pytest.mark.parametrize("reader", ["text", "integer", "number", "boolean", "array", "obj", "raw_obj"])
def test_a_missing_or_null_field_is_named(reader: str) -> None:
    for data in ({}, {"a": None}):
        with pytest.raises(ProtocolError, match="msg: missing field 'a'"):
            getattr(Fields(data, "msg"), reader)("a")


def test_entries_read_every_value_of_an_object() -> None:
    assert fields(a={"x": "1", "y": "2"}).entries("a", Fields.text) == {"x": "1", "y": "2"}
    assert fields().entries("a", Fields.text) == {} and fields(a=None).entries("a", Fields.number) == {}
    with pytest.raises(ProtocolError, match=r"msg\.a\.y: expected int or float"):
        fields(a={"x": 1, "y": "2"}).entries("a", Fields.number)


def test_booleans_arrays_and_objects_by_type() -> None:
    assert fields(a=False).boolean("a") is False
    with pytest.raises(ProtocolError, match=r"msg\.a: expected bool, got int"):
        fields(a=0).boolean("a")
    assert fields(a=[1, 2]).array("a", 2) == [1, 2] and fields(a=[0] * 100_000).array("a") == [0] * 100_000
    with pytest.raises(ProtocolError, match=r"msg\.a: more than 2 entries"):
        fields(a=[1, 2, 3]).array("a", 2)
    with pytest.raises(ProtocolError, match="more than 100000 entries"):
        fields(a=[0] * 100_001).array("a")
    inner = fields(a={"b": 1}).obj("a")
    assert inner.what == "msg.a" and inner.integer("b") == 1
    with pytest.raises(ProtocolError, match=r"msg\.a: missing field 'c'"):
        inner.text("c")
    assert fields().opt_obj("a") is None and fields(a={}).opt_obj("a") is not None
    assert fields(a={"x": 1}).raw_obj("a") == {"x": 1} and fields().opt_raw_obj("a") is None
    with pytest.raises(ProtocolError, match=r"msg\.a: expected dict, got list"):
        fields(a=[]).raw_obj("a")
    with pytest.raises(ProtocolError, match="msg: missing field 'a'"):
        fields().obj("a")
