"""``/api/v1/devices``: the fleet, filtered and paged in the store; one device with its history."""

from __future__ import annotations

from typing import Any

from edgecore.errors import OperationFailed, UserError
from edgectl.api.context import ApiContext
from edgectl.api.router import MAX_INT, ApiError, Param, Request, Response, Route
from edgectl.controller.accounts import Role
from edgectl.controller.history import with_rates
from edgectl.controller.queries import DeviceQuery
from edgectl.controller.selector import parse_selector
from edgectl.fleet import device_detail, device_page, fleet_summary
from edgectl.fleet.lifecycle import decommission_device, delete_device, fleet_pki

__all__ = ["device_routes"]

LIST_PARAMS = (
    Param("status", "string", "Presence.", enum=("online", "offline", "unknown")),
    Param("target", "string", "Target profile (a trailing * matches a prefix)."),
    Param("model", "string", "Active model name (a trailing * matches a prefix)."),
    Param("version", "integer", "Active model version.", minimum=0, maximum=MAX_INT),
    Param("tag", "string", "Tag filter KEY=VALUE (repeatable).", repeat=True),
    Param("selector", "string", "A selector as `edgectl devices --selector` takes it: k=v[,k=v], keys id, target, "
          "model, version, status, agent, site or tag keys."),
    Param("q", "string", "Text found in the id, target, model or tags."),
    Param("limit", "integer", "Page size.", minimum=1, maximum=1000, default=100),
    Param("offset", "integer", "Devices to skip.", minimum=0, maximum=MAX_INT, default=0),
    Param("decommissioned", "boolean", "true: list the decommissioned devices (kept for history) instead of the fleet.",
          default=False),
)


DETAIL_PARAMS = (
    Param("history", "integer", "Newest telemetry history points to return (oldest first); the store keeps "
          "controller.retention.telemetry_rows a device.", minimum=0, maximum=100_000, default=360),
)
NUMBER = {"type": "number", "nullable": True}
HISTORY_POINT: dict[str, Any] = {
    "type": "object",
    "description": "One kept telemetry report. Latency is of the model that served the most requests in the report's "
                   "window; the rate is the agent's throughput summed over its models, or the growth of its request "
                   "counters since the point before (null across a restart or a change of model).",
    "properties": {
        "ts": {"type": "number", "description": "When the controller received the report (Unix seconds)."},
        "model": {"type": "string", "description": "Model of the latency figures; empty when none is served."},
        "version": {"type": "integer", "nullable": True},
        "p50_ms": NUMBER, "p95_ms": NUMBER, "cpu_percent": NUMBER, "memory_percent": NUMBER,
        "requests": {"type": "integer", "nullable": True, "description": "Requests served since the agent started."},
        "rate_rps": {**NUMBER, "description": "Inference requests per second."},
    },
}
DETAIL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "device_id": {"type": "string"}, "status": {"type": "string", "enum": ["online", "offline", "unknown"]},
        "decommissioned": {"type": "number", "nullable": True,
                           "description": "When an operator decommissioned it (Unix seconds); null for a fleet member."},
        "target": {"type": "string", "nullable": True}, "model": {"type": "string", "nullable": True},
        "version": {"type": "integer", "nullable": True}, "backend": {"type": "string", "nullable": True},
        "tags": {"type": "object"}, "hardware": {"type": "object", "nullable": True},
        "telemetry": {"type": "object", "description": "The latest telemetry report, as read by the controller (its "
                      "fields: docs/protocol.md, Device reports); empty when none came."},
        "telemetry_history": {"type": "array", "items": HISTORY_POINT,
                              "description": "Latency p50/p95, CPU, memory and inference rate over time, oldest first."},
        "latency": {"type": "array", "items": {"type": "object"}, "description": "p95 figures from telemetry and health "
                    "checks, per model version (what the latency gates compare)."},
        "events": {"type": "array", "items": {"type": "object"}}, "audit": {"type": "array", "items": {"type": "object"}},
        "rollouts": {"type": "array", "items": {"type": "object"}},
    },
}


def device_query(values: dict[str, Any]) -> DeviceQuery:
    """The store query of a device list request; 400 naming the parameter at fault."""
    try:
        terms = list(parse_selector(values["selector"] or "").terms)
    except UserError as exc:
        raise ApiError(400, str(exc), "selector") from None
    _check_keys(terms, "selector")
    for key in ("status", "target", "model"):
        if values[key]:
            terms.append((key, values[key]))
    for tag in values["tag"]:
        key, sep, value = tag.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ApiError(400, f"query parameter 'tag': {tag!r} is not KEY=VALUE", "tag")
        _check_keys([(key.strip(), value)], "tag")
        terms.append((key.strip(), value.strip()))
    return DeviceQuery(tuple(terms), values["version"], values["q"] or "", values["limit"], values["offset"],
                       values["decommissioned"])


def _check_keys(terms: list[tuple[str, str]], field: str) -> None:
    """Tag keys are looked up as JSON paths in the store: one with a quote, backslash or control character is
    refused here (a 400 naming it), never sent to the store as a malformed path."""
    for key, _ in terms:
        if any(c in '"\\' or ord(c) < 32 for c in key):
            raise ApiError(400, f"query parameter {field!r}: key {key[:40]!r} has a quote, backslash or control "
                                "character, which no tag key may hold", field)


def device_routes(ctx: ApiContext) -> list[Route]:
    def list_devices(request: Request) -> Response:
        query = device_query(request.values)
        with ctx.timer.time("device_page"):
            return Response(200, device_page(ctx.store, query))

    def show_device(request: Request) -> Response:
        device_id = request.path_params["device_id"]
        with ctx.timer.time("device_detail"):
            detail = device_detail(ctx.store, device_id)
            detail["rollouts"] = [{"rollout_id": r.rollout_id, "wave": r.wave, "status": r.status.value, "state": r.state,
                                   "detail": r.detail} for r in ctx.store.device_rollouts(device_id)]
            limit = request.values["history"]
            history = with_rates(ctx.store.telemetry_history(device_id, limit=limit + 1)) if limit else []
            detail["telemetry_history"] = [p.to_dict() for p in history[-limit:]] if limit else []
        return Response(200, detail)

    def decommission(request: Request) -> Response:
        device_id = request.path_params["device_id"]
        try:
            done = decommission_device(ctx.store, device_id, request.actor, fleet_pki())
        except OperationFailed as exc:
            raise ApiError(409, str(exc), "device_id") from None
        return Response(200, done.to_dict())

    def delete(request: Request) -> Response:
        device_id = request.path_params["device_id"]
        try:
            delete_device(ctx.store, device_id, request.actor)
        except OperationFailed as exc:
            raise ApiError(409, str(exc), "device_id") from None
        return Response(200, {"deleted": device_id})

    def summary(_request: Request) -> Response:
        with ctx.timer.time("fleet_summary"):
            return Response(200, fleet_summary(ctx.store))

    return [
        Route("GET", "/api/v1/fleet/summary", Role.VIEWER, "Device counts: total, by presence, target and model@version.",
              summary, tag="devices"),
        Route("GET", "/api/v1/devices", Role.VIEWER, "List devices (filtered and paged in the store).", list_devices,
              LIST_PARAMS, tag="devices"),
        Route("GET", "/api/v1/devices/{device_id}", Role.VIEWER,
              "One device: record, hardware, latest telemetry, telemetry history (latency p50/p95, CPU, memory, "
              "inference rate), events, latency history, rollouts, audit.", show_device, DETAIL_PARAMS,
              responses={200: "OK", 404: "No such device"}, tag="devices", answer=DETAIL_SCHEMA),
        Route("POST", "/api/v1/devices/{device_id}/decommission", Role.OPERATOR,
              "Take a device out of the fleet: its certificate revoked where this host holds the fleet CA, its retained "
              "desired state cleared, its reports dropped from then on; kept for history.", decommission,
              responses={200: "Decommissioned (says what became of its certificate)", 404: "No such device",
                         409: "Decommissioned already"}, tag="devices"),
        Route("DELETE", "/api/v1/devices/{device_id}", Role.ADMIN,
              "Delete a decommissioned device's record, served models and history (rollout rows and audit stay).", delete,
              responses={200: "Deleted", 404: "No such device", 409: "Not decommissioned"}, tag="devices"),
    ]
