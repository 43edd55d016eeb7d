"""The OpenAPI 3.0 document, generated from the route table (so it lists exactly the routes served).

Each operation lists every status it can answer: its route's own, the token's (401, 403), the
body's (400, 411, 413) and those any request may get from the server itself (:data:`COMMON`:
400, 408, 417, 431, 503), the latter as shared ``components/responses``. 405 with ``Allow``
answers the methods a path does not take, which the document shows by not listing them.
"""

from __future__ import annotations

import re
from typing import Any

from edgecore import __version__
from edgectl.api.router import Param, Route

__all__ = ["openapi_document"]

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["status", "message"], "properties": {
        "status": {"type": "integer"}, "message": {"type": "string"},
        "field": {"type": "string", "description": "The body field or query parameter at fault (400)."}}}},
}
AUTH_RESPONSES = {"401": "Missing, unknown, revoked or expired token (for a JWT: why it was refused)",
                  "403": "The token's role may not call this"}
COMMON = {  # what the server may answer any request, before or beside its route
    "400": ("BadRequest", "A malformed request, or a query parameter that is unknown, repeated or out of range "
                          "(`field` names it)"),
    "408": ("Timeout", "The request's head or body did not arrive in time"),
    "417": ("ExpectationFailed", "An Expect header other than 100-continue"),
    "431": ("HeadTooLarge", "The request head is over the server's limit"),
    "503": ("Unavailable", "The store is unavailable, or the server holds too many connections: retry after "
                           "Retry-After"),
}
BODY_RESPONSES = {"400": "Bad body: not JSON, nested too deep, a number out of range, or a field at fault (`field` "
                         "names it)", "411": "A body without a Content-Length", "413": "The body is over the limit"}


def _param(p: Param) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": p.type}
    for key, value in (("minimum", p.minimum), ("maximum", p.maximum), ("default", p.default)):
        if value is not None:
            schema[key] = value
    if p.enum:
        schema["enum"] = list(p.enum)
    if p.repeat:
        schema = {"type": "array", "items": schema}
    return {"name": p.name, "in": "query", "required": False, "description": p.description, "schema": schema,
            **({"style": "form", "explode": True} if p.repeat else {})}


def _operation(route: Route) -> dict[str, Any]:
    role = route.role.value if route.role else None
    operation: dict[str, Any] = {
        "operationId": route.method.lower() + "_" + re.sub(r"[^A-Za-z0-9]+", "_", route.path.removeprefix("/api/v1")).strip("_"),
        "summary": route.summary,
        "description": f"Role: {role} or above." if role else "No token needed.",
        "tags": [route.tag] if route.tag else [],
        "parameters": [{"name": n, "in": "path", "required": True, "schema": {"type": "string"}} for n in route.path_names]
                      + [_param(p) for p in route.params],
        "responses": {str(code): _response(route, code, text) for code, text in route.responses.items()},
        "security": [{"bearer": []}, {"oidc": []}] if route.role else [],
        "x-role": role,
    }
    responses = operation["responses"]
    if route.role:
        responses.update({code: _error(text) for code, text in AUTH_RESPONSES.items()})
    if route.body is not None:
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": route.body}}}
    if route.upload is not None:
        binary = {"schema": {"type": "string", "format": "binary"}}
        operation["requestBody"] = {"required": True, "content": {route.upload: binary}}
    if "requestBody" in operation:
        for code, text in BODY_RESPONSES.items():
            responses.setdefault(code, _error(text))
    for code, (name, _text) in COMMON.items():
        responses.setdefault(code, {"$ref": f"#/components/responses/{name}"})
    return operation


def _response(route: Route, code: int, text: str) -> dict[str, Any]:
    if code >= 400:
        return _error(text)
    if route.path == "/metrics":
        return {"description": text, "content": {"text/plain": {"schema": {"type": "string"}}}}
    schema = route.answer if route.answer is not None and code < 300 else {"type": "object"}
    content: dict[str, Any] = {"application/json": {"schema": schema}}
    if route.path == "/api/v1/audit":  # format=csv
        content["text/csv"] = {"schema": {"type": "string"}}
    return {"description": text, "content": content}


def _error(text: str) -> dict[str, Any]:
    return {"description": text, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def openapi_document(routes: list[Route]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.0.3",
        "info": {"title": "edgectl controller API", "version": __version__,
                 "description": "Devices, packages, rollouts and the audit log of an edgectl fleet (docs/api.md). "
                                "Send `Authorization: Bearer <token>` (`edgectl tokens create`), or a JWT from the "
                                "single sign-on provider (docs/sso.md). Roles: viewer reads, "
                                "operator also uploads packages and steers rollouts, admin also manages users and tokens. "
                                "Every error is JSON: {\"error\": {\"status\", \"message\", \"field\"?}}."},
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {"securitySchemes": {
                           "bearer": {"type": "http", "scheme": "bearer", "description": "An edgectl token (edgectl_...)."},
                           "oidc": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT",
                                    "description": "With api.oidc set: a JWT from that OpenID Connect provider, its role "
                                                   "from the roles claim (docs/sso.md)."}},
                       "schemas": {"Error": ERROR_SCHEMA},
                       "responses": {name: _error(text) for name, text in COMMON.values()}},
    }
