"""The REST API's request checks at their edges, in process: query parameters (unknown, repeated, integers of 20
and 21 digits, booleans, enums, defaults), the JSON body schema subset (types, booleans that are not integers,
enums, bounds, minLength, minItems, required and unknown fields), JSON reading, routing, and the device list
query (tag keys with control characters at 31 and 32). ./scripts/mutants runs these for edgectl/api/router.py
and edgectl/api/devices.py."""

from __future__ import annotations

from typing import Any

import pytest

from edgectl.api.devices import device_query
from edgectl.api.router import MAX_DEPTH, MAX_INT, ApiError, Param, Response, Route, Router, check_body, check_query, read_json

LIMIT = Param("limit", "integer", "", minimum=1, maximum=500, default=100)
WIDE = Param("n", "integer", "", minimum=-(10**21), maximum=10**21)
FLAG = Param("flag", "boolean", "", default=False)
STATUS = Param("status", "string", "", enum=("online", "offline"))
TEXT = Param("q", "string", "")
TAGS = Param("tag", "string", "", repeat=True)


def _refused(call: Any, *args: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call(*args)
    assert caught.value.status == 400
    return caught.value


# -- query parameters ---------------------------------------------------------------------------------------------


def test_an_unknown_query_parameter_is_refused_naming_it_and_the_known_ones() -> None:
    error = _refused(check_query, (LIMIT, FLAG), {"limt": ["1"]})
    assert error.field == "limt" and error.message == "unknown query parameter 'limt' (known: limit, flag)"
    assert _refused(check_query, (), {"x": []}).message == "unknown query parameter 'x' (known: none)"


def test_a_parameter_given_twice_is_refused_unless_it_repeats() -> None:
    error = _refused(check_query, (LIMIT,), {"limit": ["1", "1"]})
    assert error.field == "limit" and error.message == "query parameter 'limit' given 2 times"
    assert _refused(check_query, (LIMIT,), {"limit": ["1", "2", "3"]}).message == "query parameter 'limit' given 3 times"
    assert check_query((TAGS,), {"tag": ["a=1", "b=2"]}) == {"tag": ["a=1", "b=2"]}
    assert check_query((TAGS,), {"tag": ["a=1"]}) == {"tag": ["a=1"]}
    assert check_query((TAGS,), {}) == {"tag": []}


def test_missing_parameters_take_their_defaults_and_given_ones_their_values() -> None:
    assert check_query((LIMIT, FLAG, STATUS, TEXT), {}) == {"limit": 100, "flag": False, "status": None, "q": None}
    assert check_query((LIMIT, FLAG, STATUS, TEXT), {"limit": ["7"], "flag": ["true"], "status": ["offline"], "q": ["x"]}) == \
        {"limit": 7, "flag": True, "status": "offline", "q": "x"}


@pytest.mark.parametrize(("text", "value"), [("1", 1), ("500", 500), (" 42 ", 42), ("0500", 500)])
def test_query_integers_at_and_inside_their_bounds_are_read(text: str, value: int) -> None:
    assert check_query((LIMIT,), {"limit": [text]}) == {"limit": value}


@pytest.mark.parametrize("text", ["0", "501", "-1", "9" * 20, "9" * 21])
def test_query_integers_outside_their_bounds_are_refused(text: str) -> None:
    error = _refused(check_query, (LIMIT,), {"limit": [text]})
    assert error.field == "limit" and error.message == f"query parameter 'limit': {text.strip()[:24]} is outside 1..500"


def test_a_query_integer_of_20_digits_is_read_and_one_of_21_is_out_of_range() -> None:
    twenty, twenty_one = "1" + "0" * 19, "1" + "0" * 20  # 10**19 and 10**20, both inside -10**21..10**21
    assert check_query((WIDE,), {"n": [twenty]}) == {"n": 10**19}
    assert check_query((WIDE,), {"n": ["-" + twenty]}) == {"n": -(10**19)}
    assert _refused(check_query, (WIDE,), {"n": [twenty_one]}).message == \
        f"query parameter 'n': {twenty_one} is outside {-(10**21)}..{10**21}"
    assert _refused(check_query, (WIDE,), {"n": ["-" + twenty_one]}).field == "n"


@pytest.mark.parametrize(("text", "value"), [("true", True), ("false", False)])
def test_a_boolean_parameter_is_true_or_false(text: str, value: bool) -> None:
    assert check_query((FLAG,), {"flag": [text]}) == {"flag": value}


@pytest.mark.parametrize("text", ["True", "1", "yes", "", "false "])
def test_a_boolean_parameter_refuses_anything_else(text: str) -> None:
    error = _refused(check_query, (FLAG,), {"flag": [text]})
    assert error.field == "flag" and error.message == "query parameter 'flag': expected true or false"


def test_an_enum_parameter_takes_only_its_values_and_a_plain_string_anything() -> None:
    assert check_query((STATUS,), {"status": ["online"]}) == {"status": "online"}
    error = _refused(check_query, (STATUS,), {"status": ["gone"]})
    assert error.field == "status" and error.message == "query parameter 'status': 'gone' is not one of online, offline"
    assert check_query((TEXT,), {"q": ["true"]}) == {"q": "true"}
    assert check_query((TEXT,), {"q": ["gone"]}) == {"q": "gone"}


def test_only_an_integer_parameter_needs_bounds() -> None:
    assert Param("q", "string", "").minimum is None
    assert Param("n", "integer", "", minimum=0, maximum=1).maximum == 1
    for bounds in ({"minimum": 1}, {"maximum": 1}, {}):
        with pytest.raises(TypeError, match="an integer needs a minimum and a maximum"):
            Param("n", "integer", "", **bounds)  # type: ignore[arg-type]


# -- the JSON body schema ---------------------------------------------------------------------------------------------

BODY: dict[str, Any] = {
    "type": "object", "required": ["name"], "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "mode": {"type": "string", "enum": ["fast", "safe"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 10},
        "ratio": {"type": "number"},
        "on": {"type": "boolean"},
        "ids": {"type": "array", "minItems": 2, "items": {"type": "string"}},
        "inner": {"type": "object", "required": ["x"], "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 1}}},
    },
}


def test_a_body_inside_its_schema_passes() -> None:
    check_body(BODY, {"name": "a", "mode": "safe", "count": 10, "ratio": 0.5, "on": True, "ids": ["x", "y"], "inner": {"x": 1}})
    check_body(BODY, {"name": "a", "on": False, "count": 0, "ratio": 3})
    check_body({"type": "object"}, {"anything": 1})  # no additionalProperties: unknown fields are let through
    check_body({"type": "object", "additionalProperties": True}, {"anything": 1})
    check_body({}, [1, "a", None])  # no type: anything
    check_body({"type": "array"}, [])  # no minItems


@pytest.mark.parametrize(("body", "message", "field"), [
    ([], "body: expected an object", None),
    ({"name": 1}, "name: expected a string", "name"),
    ({"name": "a", "count": "1"}, "count: expected an integer", "count"),
    ({"name": "a", "count": True}, "count: expected an integer", "count"),
    ({"name": "a", "ratio": False}, "ratio: expected a number", "ratio"),
    ({"name": "a", "on": 1}, "on: expected a boolean", "on"),
    ({"name": "a", "mode": "slow"}, "mode: 'slow' is not one of fast, safe", "mode"),
    ({"name": "a", "count": -1}, "count: must be at least 0", "count"),
    ({"name": "a", "count": 11}, "count: must be at most 10", "count"),
    ({"name": ""}, "name: must not be empty", "name"),
    ({"name": "a", "ids": ["x"]}, "ids: needs at least 2 item(s)", "ids"),
    ({"name": "a", "ids": ["x", 2]}, "ids[1]: expected a string", "ids[1]"),
    ({}, "name: required", "name"),
    ({"name": "a", "other": 1}, "other: unknown field (known: name, mode, count, ratio, on, ids, inner)", "other"),
    ({"name": "a", "inner": {}}, "inner.x: required", "inner.x"),
    ({"name": "a", "inner": {"x": 2}}, "inner.x: must be at most 1", "inner.x"),
])
def test_a_body_outside_its_schema_is_refused_naming_the_field(body: Any, message: str, field: str | None) -> None:
    error = _refused(check_body, BODY, body)
    assert (error.message, error.field) == (message, field)


def test_a_value_checked_at_the_top_is_named_body() -> None:
    assert _refused(check_body, {"type": "integer"}, "1").message == "body: expected an integer"
    assert _refused(check_body, {"type": "integer"}, "1").field is None
    assert _refused(check_body, {"enum": [1, 2]}, 3).message == "body: 3 is not one of 1, 2"
    assert _refused(check_body, {"type": "string", "minLength": 2}, "a").message == "body: must not be empty"
    check_body({"type": "string", "minLength": 2}, "ab")
    check_body({"type": "string", "minLength": 0}, "")
    check_body({"type": "string"}, "")
    assert _refused(check_body, {"type": "array", "minItems": 1}, []).message == "body: needs at least 1 item(s)"
    check_body({"type": "array", "minItems": 1}, [0])
    check_body({"minimum": 0, "minLength": 5, "minItems": 5}, True)  # a boolean is not a number, string or array here
    check_body({"minimum": 5, "minItems": 5}, "ab")
    check_body({"minLength": 5}, [1])
    check_body({"minLength": 5}, 1)


# -- JSON and routing -------------------------------------------------------------------------------------------------


def test_json_limits() -> None:
    assert read_json(b"1") == 1 and read_json(b"-9223372036854775807") == -MAX_INT
    assert read_json(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH) is not None
    assert _refused(read_json, b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)).message == \
        f"body: nested deeper than {MAX_DEPTH} levels"
    assert read_json(b'{"a": ' * (MAX_DEPTH - 1) + b"{}" + b"}" * (MAX_DEPTH - 1)) is not None
    assert _refused(read_json, b'{"a": ' * MAX_DEPTH + b"{}" + b"}" * MAX_DEPTH).message.startswith("body: nested deeper")
    assert read_json(b'[[], [[1]], {"a": [2]}]') == [[], [[1]], {"a": [2]}]


def test_a_route_with_a_path_parameter_matches_one_segment() -> None:
    def ok(_request: object) -> Response:
        return Response(200, {})

    router = Router([Route("GET", "/r/{rid}", None, "", ok), Route("POST", "/r/{rid}/go", None, "", ok)])
    route, params = router.match("GET", "/r/abc")
    assert route.path == "/r/{rid}" and params == {"rid": "abc"} and route.path_names == ["rid"]
    assert router.match("POST", "/r/x/go")[1] == {"rid": "x"}
    for path in ("/r/a/b", "/r/", "/r/a/go/x"):
        with pytest.raises(ApiError) as caught:
            router.match("GET", path)
        assert caught.value.status == 404 and caught.value.message == f"no such endpoint: {path} (see /api/v1/openapi.json)"
    with pytest.raises(ApiError) as wrong:
        router.match("DELETE", "/r/x/go")
    assert wrong.value.status == 405 and wrong.value.headers == {"Allow": "POST"}
    assert wrong.value.body() == {"error": {"status": 405, "message": "DELETE is not allowed on /r/x/go (allowed: POST)"}}
    assert ApiError(400, "m", "f").body() == {"error": {"status": 400, "message": "m", "field": "f"}}


# -- the device list query --------------------------------------------------------------------------------------------

QUERY: dict[str, Any] = {"selector": None, "status": None, "target": None, "model": None, "tag": [], "version": None,
                         "q": None, "limit": 10, "offset": 0, "decommissioned": False}


def test_a_device_query_carries_every_filter() -> None:
    query = device_query({**QUERY, "selector": "site=a", "status": "online", "target": "pi", "model": "m", "tag": [" k = v "],
                          "version": 3, "q": "abc", "limit": 5, "offset": 2})
    assert query.terms == (("site", "a"), ("status", "online"), ("target", "pi"), ("model", "m"), ("k", "v"))
    assert (query.version, query.text, query.limit, query.offset) == (3, "abc", 5, 2)
    assert device_query(QUERY).text == "" and not device_query(QUERY).decommissioned
    assert device_query({**QUERY, "decommissioned": True}).decommissioned


def test_a_selector_that_does_not_parse_is_a_bad_request() -> None:
    error = _refused(device_query, {**QUERY, "selector": "site"})
    assert error.field == "selector"


@pytest.mark.parametrize("tag", ["k", "=v", "k=", " =v", "k= ", ""])
def test_a_tag_that_is_not_key_equals_value_is_refused(tag: str) -> None:
    error = _refused(device_query, {**QUERY, "tag": [tag]})
    assert (error.field, error.message) == ("tag", f"query parameter 'tag': {tag!r} is not KEY=VALUE")


def test_a_tag_key_with_a_control_character_is_refused_and_a_space_is_not() -> None:
    for key in ("a\x1fb", "a\x00", "\x1f"):
        assert _refused(device_query, {**QUERY, "selector": f"{key}=1"}).field == "selector"
        assert _refused(device_query, {**QUERY, "tag": [f"{key}=1"]}).field == "tag"
    assert device_query({**QUERY, "selector": "a b=1"}).terms == (("a b", "1"),)
    assert device_query({**QUERY, "tag": ["a b=1", "!x=2"]}).terms == (("a b", "1"), ("!x", "2"))
