"""``/api/v1/me``, ``/users``, ``/tokens``, ``/audit``, ``/health``: who is calling, accounts, the audit log."""

from __future__ import annotations

from typing import Any

from edgecore.errors import UserError
from edgectl.api.accounts import MAX_TOKEN_DAYS, NameTaken, parse_role
from edgectl.api.context import ApiContext
from edgectl.api.router import MAX_INT, ApiError, Param, Request, Response, Route
from edgectl.controller.accounts import ROLES, Role
from edgectl.controller.queries import AuditQuery
from edgectl.fleet.audit import audit_csv, parse_time

__all__ = ["admin_routes"]

DAY_S = 86400.0
USER_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["name", "role"],
    "properties": {"name": {"type": "string", "minLength": 1}, "role": {"type": "string", "enum": [r.value for r in ROLES]}},
}
TOKEN_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["user"],
    "properties": {"user": {"type": "string", "minLength": 1}, "name": {"type": "string"},
                   "expires_days": {"type": "number", "minimum": 0.001, "maximum": MAX_TOKEN_DAYS,
                                    "description": "Lifetime; none: no expiry."}},
}
AUDIT_PARAMS = (
    Param("rollout_id", "string", "Only entries about this rollout."),
    Param("device_id", "string", "Only entries about this device."),
    Param("actor", "string", "Only entries of this actor (`user:alice`, `controller`); a trailing * matches a prefix."),
    Param("action", "string", "Only entries of this action (`device decommissioned`); a trailing * matches a prefix."),
    Param("since", "string", "Entries at or after this time: Unix seconds or ISO 8601 (UTC unless an offset is given)."),
    Param("until", "string", "Entries before this time: Unix seconds or ISO 8601."),
    Param("limit", "integer", "Newest entries to return (oldest first).", minimum=1, maximum=100_000, default=200),
    Param("offset", "integer", "Newest matching entries to skip (the next page back in time).", minimum=0, maximum=MAX_INT,
          default=0),
    Param("format", "string", "`csv`: the entries as a CSV file (cells a spreadsheet would run as formulas start with ').",
          enum=("json", "csv"), default="json"),
)
CSV_TYPE = "text/csv; charset=utf-8"


def audit_query(values: dict[str, Any]) -> AuditQuery:
    """The store query of an audit request; 400 naming the parameter at fault."""
    times: dict[str, float | None] = {}
    for name in ("since", "until"):
        try:
            times[name] = None if values[name] is None else parse_time(values[name], f"query parameter {name!r}")
        except UserError as exc:
            raise ApiError(400, str(exc), name) from None
    since, until = times["since"], times["until"]
    if since is not None and until is not None and until <= since:
        raise ApiError(400, "query parameter 'until': must be after 'since'", "until")
    return AuditQuery(values["actor"] or "", values["action"] or "", values["rollout_id"] or "", values["device_id"] or "",
                      since, until, values["limit"], values["offset"])


def admin_routes(ctx: ApiContext) -> list[Route]:
    accounts = ctx.accounts

    def health(_request: Request) -> Response:
        """Inside `controller run`: the controller's own health (edgectl/controller/health.py), 503 while its store is
        unavailable; a bare API server: liveness."""
        health = getattr(ctx.controller, "health", None)
        if health is None:
            return Response(200, {"status": "ok"})
        snapshot = health.snapshot()
        return Response(503 if snapshot["status"] == "unavailable" else 200, snapshot)

    def me(request: Request) -> Response:
        assert request.principal is not None
        p = request.principal
        return Response(200, {"user": p.user, "role": p.role.value, "token_id": p.token_id})

    def audit(request: Request) -> Response:
        query = audit_query(request.values)
        with ctx.timer.time("audit_log"):
            page = ctx.store.audit_page(query)
        if request.values["format"] == "csv":
            return Response(200, audit_csv(page.entries).encode(), CSV_TYPE,
                            {"Content-Disposition": 'attachment; filename="edgectl-audit.csv"'})
        return Response(200, {"entries": [e.to_dict() for e in page.entries], "total": page.total, "limit": query.limit,
                              "offset": query.offset})

    def users(_request: Request) -> Response:
        return Response(200, {"users": [u.to_dict() for u in accounts.users()]})

    def add_user(request: Request) -> Response:
        body = request.values["body"]
        try:
            return Response(201, accounts.add_user(body["name"], parse_role(body["role"]), request.actor).to_dict())
        except NameTaken as exc:
            raise ApiError(409, str(exc), "name") from None

    def remove_user(request: Request) -> Response:
        accounts.remove_user(request.path_params["name"], request.actor)
        return Response(200, {"removed": request.path_params["name"]})

    def tokens(request: Request) -> Response:
        return Response(200, {"tokens": [t.to_dict() for t in accounts.tokens(request.values["user"])]})

    def create_token(request: Request) -> Response:
        body = request.values["body"]
        days = body.get("expires_days")
        row, token = accounts.create_token(body["user"], body.get("name", ""), None if days is None else days * DAY_S,
                                           request.actor)
        return Response(201, {**row.to_dict(), "token": token})

    def revoke_token(request: Request) -> Response:
        accounts.revoke_token(request.path_params["token_id"], request.actor)
        return Response(200, {"revoked": request.path_params["token_id"]})

    return [
        Route("GET", "/api/v1/health", None, "Liveness, and inside `controller run` its store, lease, broker and ingest "
              "(no token needed; 503 while the store is unavailable).", health, tag="meta"),
        Route("GET", "/api/v1/me", Role.VIEWER, "The caller: user, role and token id.", me, tag="meta"),
        Route("GET", "/api/v1/audit", Role.VIEWER, "The audit log: operator actions (with their actor), controller "
              "decisions, device transitions; filtered, paged (newest first), or exported as CSV.", audit, AUDIT_PARAMS,
              responses={200: "The entries (JSON), or text/csv with format=csv", 400: "Bad filter (names the field)"},
              tag="audit"),
        Route("GET", "/api/v1/users", Role.ADMIN, "List users.", users, tag="access"),
        Route("POST", "/api/v1/users", Role.ADMIN, "Add a user with a role.", add_user, body=USER_SCHEMA,
              responses={201: "Added", 409: "A user of that name exists"}, tag="access"),
        Route("DELETE", "/api/v1/users/{name}", Role.ADMIN, "Remove a user and revoke its tokens.", remove_user,
              responses={200: "Removed", 404: "No such user"}, tag="access"),
        Route("GET", "/api/v1/tokens", Role.ADMIN, "List tokens (never their secret).", tokens,
              (Param("user", "string", "Only this user's tokens."),), tag="access"),
        Route("POST", "/api/v1/tokens", Role.ADMIN, "Create a token for a user; the answer holds it, once.", create_token,
              body=TOKEN_SCHEMA, responses={201: "Created", 404: "No such user"}, tag="access"),
        Route("DELETE", "/api/v1/tokens/{token_id}", Role.ADMIN, "Revoke a token.", revoke_token,
              responses={200: "Revoked", 404: "No such active token"}, tag="access"),
    ]
