"""What issue 24 found the API answering outside HTTP and its own document, each case on a real server and store.

``/devices?offset=99999999999999999999`` answered 500; HEAD, OPTIONS and TRACE got 501 with an HTML
page; 400s that the OpenAPI document did not list; 400 for a duplicate user (409 fits); answers
naming server file paths. Schemathesis then checks every operation against the document with an
admin and with a viewer token: no 5xx, every status and body as documented, 405 for the rest.
"""

from __future__ import annotations

import http.client
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from prometheus_client import CollectorRegistry

from edgecore.protocol.envelope import TrustedKeys
from edgecore.protocol.manifest import TargetInfo
from edgectl.api import ApiServer, api_context, api_routes, openapi_document
from edgectl.api.accounts import Accounts
from edgectl.api.context import ApiContext
from edgectl.config import EdgectlConfig
from edgectl.controller.accounts import Role
from edgectl.controller.store import SqliteStore, Store
from edgectl.examples import tiny_classifier
from edgectl.keys import Keyring
from edgectl.package import BuildOptions, build_package


@dataclass
class Served:
    server: ApiServer
    tokens: dict[str, str]
    home: Path
    package: Path

    def call(self, method: str, path: str, body: bytes | None = None, role: str = "admin",
             headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
        conn.request(method, path, body=body, headers={"Authorization": f"Bearer {self.tokens[role]}", **(headers or {})})
        answer = conn.getresponse()
        data = answer.read()
        conn.close()
        return answer.status, data, dict(answer.headers)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    home = tmp_path_factory.mktemp("home")
    previous = os.environ.get("EDGECTL_HOME")
    os.environ["EDGECTL_HOME"] = str(home)  # where the API keeps what no answer may name
    store = SqliteStore(home / "controller.db")
    ring = Keyring(home / "keys")
    ring.init("package")
    package = home / "m.edgepkg"
    build_package(tiny_classifier(home / "m.onnx"), BuildOptions("m", 1, TargetInfo("any")), ring.signing_key("package"),
                  package)
    ctx = api_context(store, EdgectlConfig(), keyring=ring)
    accounts = Accounts(store)
    tokens = {}
    for role in (Role.ADMIN, Role.VIEWER):
        accounts.add_user(role.value, role, "test")
        tokens[role.value] = accounts.create_token(role.value, "", None, "test")[1]
    server = ApiServer(ctx, api_routes(ctx), "127.0.0.1", 0).start()
    yield Served(server, tokens, home, package)
    server.stop()
    store.close()
    if previous is None:
        del os.environ["EDGECTL_HOME"]
    else:
        os.environ["EDGECTL_HOME"] = previous


def _error(raw: bytes) -> dict[str, Any]:
    error: dict[str, Any] = json.loads(raw)["error"]
    return error


def test_an_offset_past_any_integer_answers_400(served: Served) -> None:
    status, raw, _ = served.call("GET", "/api/v1/devices?offset=99999999999999999999")
    assert status == 400 and _error(raw)["field"] == "offset"


@pytest.mark.parametrize("method", ["OPTIONS", "TRACE", "PUT", "PATCH", "DELETE"])
def test_other_methods_answer_json_405_with_allow(served: Served, method: str) -> None:
    for path, allow in (("/api/v1/devices", "GET, HEAD"), ("/api/v1/users", "GET, HEAD, POST"),
                        ("/console/", "GET, HEAD")):
        status, raw, headers = served.call(method, path)
        assert (status, headers["Allow"], headers["Content-Type"]) == (405, allow, "application/json"), (method, path)
        assert _error(raw)["message"].startswith(f"{method} is not allowed on {path}")


def test_head_answers_as_get_without_the_body(served: Served) -> None:
    for path in ("/api/v1/devices", "/api/v1/openapi.json", "/console/"):
        got = served.call("GET", path)
        head = served.call("HEAD", path)
        assert (head[0], head[1], head[2]["Content-Length"]) == (200, b"", str(len(got[1]))), path


def test_a_duplicate_user_is_a_conflict(served: Served) -> None:
    body = json.dumps({"name": "dup", "role": "viewer"}).encode()
    assert served.call("POST", "/api/v1/users", body)[0] == 201
    status, raw, _ = served.call("POST", "/api/v1/users", body)
    assert (status, _error(raw)["field"]) == (409, "name")
    assert "exists already" in _error(raw)["message"]


def test_no_answer_names_a_server_path(served: Served) -> None:
    answers = [served.call("POST", "/api/v1/packages", b"not a package"),
               served.call("POST", "/api/v1/packages", served.package.read_bytes()[:2000]),
               served.call("POST", "/api/v1/packages", served.package.read_bytes()),
               served.call("GET", "/api/v1/packages")]
    assert [a[0] for a in answers] == [400, 400, 201, 200]
    assert "<server path>" in _error(answers[0][1])["message"]  # the message keeps its shape, the path goes
    for status, raw, _ in answers:
        text = raw.decode()
        for private in (str(served.home), tempfile.gettempdir() + "/"):
            assert private not in text, (status, text[:300])
    assert "path" not in json.loads(answers[3][1])["packages"][0]


def test_every_error_status_is_in_the_document(served: Served) -> None:
    """The statuses the server itself answers any request (not its routes) are listed on every operation."""
    document = json.loads(served.call("GET", "/api/v1/openapi.json")[1])
    for path, item in document["paths"].items():
        for method, operation in item.items():
            assert {"400", "408", "417", "431", "503"} <= set(operation["responses"]), (method, path)
            if "requestBody" in operation:
                assert {"411", "413"} <= set(operation["responses"]), (method, path)
    bad = [("GET", "/api/v1/devices?nope=1", None, {}, 400), ("POST", "/api/v1/users", b"{}", {"Expect": "magic"}, 417),
           ("GET", "/api/v1/devices", None, {"X-Big": "x" * 40_000}, 431)]
    for method, path, body, headers, status in bad:
        assert served.call(method, path, body, headers=headers)[0] == status, (method, path)


def _document() -> dict[str, Any]:
    """The document the server serves (a route's handler refers to the context only when called)."""
    ctx = ApiContext(cast(Store, None), cast(Accounts, None), lambda: TrustedKeys([]), CollectorRegistry())
    return openapi_document(api_routes(ctx))


schema = schemathesis.openapi.from_dict(_document())


def _conforms(case: Any, served: Served, role: str) -> None:
    response = case.call(base_url=served.server.url, headers={"Authorization": f"Bearer {served.tokens[role]}"})
    case.validate_response(response, checks=[schemathesis.checks.not_a_server_error,
                                             schemathesis.checks.status_code_conformance,
                                             schemathesis.checks.content_type_conformance,
                                             schemathesis.checks.response_schema_conformance])
    assert str(served.home) not in response.text


@schema.parametrize()
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
def test_schemathesis_as_admin(case: Any, served: Served) -> None:
    _conforms(case, served, "admin")


@schema.parametrize()
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
def test_schemathesis_as_viewer(case: Any, served: Served) -> None:
    _conforms(case, served, "viewer")
