"""What the API refuses before a handler acts: JSON that is not finite, in range and shallow; absurd query integers;
numbers past a schema's bounds; methods a path does not take; tag keys the store cannot look up; token lifetimes
that are not finite, positive and bounded. In process: the tests ./scripts/mutants runs for these modules."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgecore.errors import UserError
from edgectl.api.accounts import MAX_TOKEN_DAYS, Accounts
from edgectl.api.devices import device_query
from edgectl.api.router import (
    MAX_DEPTH,
    MAX_INT,
    ApiError,
    Param,
    Request,
    Response,
    Route,
    Router,
    check_body,
    check_query,
    read_json,
)
from edgectl.controller.accounts import Role
from edgectl.controller.store import SqliteStore

OFFSET = Param("offset", "integer", "", minimum=0, maximum=MAX_INT, default=0)
SCHEMA = {"type": "object", "properties": {"days": {"type": "number", "minimum": 0.001, "maximum": 3650},
                                           "count": {"type": "integer", "minimum": 0, "maximum": 10}}}


def _refused(call: object, *args: object) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call(*args)  # type: ignore[operator]
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize(("raw", "message"), [
    (b'{"a": NaN}', "body: NaN is not a number (JSON has no NaN or Infinity)"),
    (b'{"a": Infinity}', "body: Infinity is not a number (JSON has no NaN or Infinity)"),
    (b'[-Infinity]', "body: -Infinity is not a number (JSON has no NaN or Infinity)"),
    (b'{"a": 1e999}', "body: the number 1e999 is out of range"),
    (b'{"a": -1e999}', "body: the number -1e999 is out of range"),
    (b'{"a": 10000000000000000000}', "body: the number 10000000000000000000 is out of range"),
    (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), f"body: nested deeper than {MAX_DEPTH} levels"),
    (b'{"a": ' * 200_000 + b"1" + b"}" * 200_000, f"body: nested deeper than {MAX_DEPTH} levels"),
    (b"{", "body: not valid JSON"), (b"\xff", "body: not valid JSON"),
])
def test_json_that_is_not_finite_in_range_and_shallow_is_refused(raw: bytes, message: str) -> None:
    assert _refused(read_json, raw).message == message


def test_json_at_the_limits_is_read() -> None:
    deepest = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    assert read_json(deepest) is not None and read_json(b"") is None
    assert read_json(b'{"a": 9999999999999999999, "b": -9999999999999999999, "c": 1.5e308}') == \
        {"a": 9999999999999999999, "b": -9999999999999999999, "c": 1.5e308}
    assert read_json(b'{"a": {"b": [1, {"c": []}]}}') == {"a": {"b": [1, {"c": []}]}}


@pytest.mark.parametrize("value", [-1, 2**63, 10**30])
def test_a_query_integer_outside_its_bounds_is_refused(value: int) -> None:
    error = _refused(check_query, (OFFSET,), {"offset": [str(value)]})
    assert error.field == "offset" and f"is outside 0..{MAX_INT}" in error.message


@pytest.mark.parametrize("text", ["NaN", "1e3", "0x10", "1_000", "+1", "", "١٢"])
def test_a_query_integer_that_is_not_digits_is_refused(text: str) -> None:
    assert _refused(check_query, (OFFSET,), {"offset": [text]}).message.endswith("is not an integer")


def test_query_integers_at_their_bounds_are_read() -> None:
    assert check_query((OFFSET,), {"offset": [str(MAX_INT)]}) == {"offset": MAX_INT}
    assert check_query((OFFSET,), {"offset": ["0"]}) == {"offset": 0}
    assert check_query((OFFSET,), {}) == {"offset": 0}
    with pytest.raises(ApiError, match=r"'offset': 9{24} is outside"):
        check_query((OFFSET,), {"offset": ["9" * 5000]})  # cut short, never int() of 5,000 digits


def test_an_integer_parameter_must_declare_its_bounds() -> None:
    with pytest.raises(TypeError, match="an integer needs a minimum and a maximum"):
        Param("limit", "integer", "", minimum=1)


@pytest.mark.parametrize(("body", "field"), [({"days": 3650.5}, "days"), ({"days": 0}, "days"), ({"count": 11}, "count"),
                                             ({"count": -1}, "count"), ({"days": 1e308}, "days")])
def test_a_number_past_its_schema_bounds_is_refused(body: dict[str, float], field: str) -> None:
    assert _refused(check_body, SCHEMA, body).field == field


def test_numbers_at_their_schema_bounds_pass() -> None:
    for body in ({"days": 3650}, {"days": 0.001}, {"count": 0}, {"count": 10}):
        check_body(SCHEMA, body)


def _route(method: str, path: str) -> Route:
    return Route(method, path, None, "", lambda _r: Response(200, {}))


def test_head_is_answered_by_get_and_other_methods_get_405_with_allow() -> None:
    router = Router([_route("GET", "/a"), _route("POST", "/a"), _route("DELETE", "/b/{x}")])
    assert router.match("HEAD", "/a")[0].method == "GET"
    for method, path, allow in (("OPTIONS", "/a", "GET, HEAD, POST"), ("TRACE", "/a", "GET, HEAD, POST"),
                                ("GET", "/b/1", "DELETE"), ("HEAD", "/b/1", "DELETE")):
        with pytest.raises(ApiError) as caught:
            router.match(method, path)
        assert (caught.value.status, caught.value.headers) == (405, {"Allow": allow}), (method, path)
    with pytest.raises(ApiError) as missing:
        router.match("GET", "/c")
    assert missing.value.status == 404
    assert isinstance(Request("GET", "/a", {}, {}, {}).actor, str)


QUERY: dict[str, object] = {"selector": None, "status": None, "target": None, "model": None, "tag": [], "version": None,
                            "q": None, "limit": 10, "offset": 0, "decommissioned": False}


@pytest.mark.parametrize(("param", "value"), [("selector", 'ta"g=1'), ("selector", "a\\b=1"), ("selector", "a\x01=1"),
                                              ("tag", 'a"b=1'), ("tag", "a\\b=1")])
def test_a_tag_key_the_store_cannot_look_up_is_a_bad_request(param: str, value: str) -> None:
    error = _refused(device_query, {**QUERY, param: [value] if param == "tag" else value})
    assert error.field == param and "no tag key may hold" in error.message


def test_ordinary_tag_keys_are_queried() -> None:
    query = device_query({**QUERY, "selector": "group=lobby,site.name=a b", "tag": ["floor-2=x", "é=1"]})
    assert query.terms == (("group", "lobby"), ("site.name", "a b"), ("floor-2", "x"), ("é", "1"))


@pytest.mark.parametrize("days", [float("nan"), float("inf"), -1.0, 0.0, MAX_TOKEN_DAYS + 1e-6, 1e308])
def test_a_token_lifetime_must_be_finite_positive_and_bounded(tmp_path: Path, days: float) -> None:
    store = SqliteStore(tmp_path / "store.db")
    accounts = Accounts(store)
    accounts.add_user("v", Role.VIEWER, "test")
    with pytest.raises(UserError, match=f"at most {MAX_TOKEN_DAYS} days"):
        accounts.create_token("v", "", days * 86400.0, "test")
    row, _ = accounts.create_token("v", "", MAX_TOKEN_DAYS * 86400.0, "test")
    assert row.expires is not None and row.expires - row.created == MAX_TOKEN_DAYS * 86400.0
    assert [t.id for t in accounts.tokens("v")] == [row.id]
    store.close()
