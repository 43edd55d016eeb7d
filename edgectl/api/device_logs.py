"""``/api/v1/devices/{device_id}/logs``: ask a device for its recent log lines; read the latest answer.

The request is stored (edgectl/controller/logs.py): the engine leader sends it signed, whichever
replica receives the answer stores it, and this route waits for it in the store, so it works on any
replica. No answer within ``wait_s`` is a 504 that says whether the request was sent at all.
"""

from __future__ import annotations

from typing import Any

from edgecore.errors import NotFoundError, OperationFailed
from edgecore.protocol.logs import DEFAULT_LINES, LEVELS, MAX_LINES, LogQuery
from edgectl.api.context import ApiContext
from edgectl.api.router import ApiError, Request, Response, Route
from edgectl.controller.accounts import Role
from edgectl.controller.logs import DEFAULT_WAIT_S, MAX_WAIT_S, NoAnswer, ask_logs, new_request_id

__all__ = ["ASK_SCHEMA", "device_log_routes"]

LAST_UNIX_TIME = 253402300799  # 9999-12-31T23:59:59Z: a later since/until is a mistake (1e308 is finite)
ASK_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "lines": {"type": "integer", "minimum": 1, "maximum": MAX_LINES,
                  "description": f"The newest lines to return (default {DEFAULT_LINES}; {MAX_LINES} with since or until)."},
        "since": {"type": "number", "minimum": 0, "maximum": LAST_UNIX_TIME,
                  "description": "Only records at or after this Unix time."},
        "until": {"type": "number", "minimum": 0, "maximum": LAST_UNIX_TIME,
                  "description": "Only records at or before this Unix time."},
        "level": {"type": "string", "enum": list(LEVELS), "description": "Only records at this level or above."},
        "wait_s": {"type": "number", "minimum": 1, "maximum": MAX_WAIT_S,
                   "description": f"How long to wait for the device's answer (default {DEFAULT_WAIT_S:g})."},
    },
}
ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "request_id": {"type": "string"}, "device_id": {"type": "string"}, "query": {"type": "object"},
        "actor": {"type": "string"}, "asked": {"type": "number"}, "sent": {"type": "number", "nullable": True},
        "answered": {"type": "number", "nullable": True},
        "lines": {"type": "array", "nullable": True, "items": {"type": "object", "properties": {
            "ts": {"type": "number"}, "level": {"type": "string"}, "logger": {"type": "string"},
            "message": {"type": "string"}}}},
        "truncated": {"type": "boolean", "nullable": True, "description": "Older matching lines were left out (size cap)."},
        "held_since": {"type": "number", "nullable": True,
                       "description": "The oldest record the device still held: older is unknown, not empty."},
    },
}


def device_log_routes(ctx: ApiContext) -> list[Route]:
    def ask(request: Request) -> Response:
        device_id = request.path_params["device_id"]
        body: dict[str, Any] = request.values["body"]
        since, until = body.get("since"), body.get("until")
        if since is not None and until is not None and since > until:
            raise ApiError(400, "since: later than until", "since")
        query = LogQuery.asked(new_request_id(), body.get("lines"), since, until, body.get("level", "DEBUG"))
        try:
            answered = ask_logs(ctx.store, device_id, query, request.actor, float(body.get("wait_s", DEFAULT_WAIT_S)))
        except NotFoundError as exc:
            raise ApiError(404, str(exc), "device_id") from None
        except NoAnswer as exc:
            raise ApiError(504, str(exc), "device_id") from None
        except OperationFailed as exc:
            raise ApiError(409, str(exc), "device_id") from None
        return Response(200, answered.to_dict())

    def latest(request: Request) -> Response:
        device_id = request.path_params["device_id"]
        answered = ctx.store.latest_log_answer(device_id)
        if answered is None:
            known = ctx.store.device(device_id) is not None
            raise ApiError(404, f"no logs of device {device_id!r} were fetched yet: POST to this path asks for them" if known
                           else f"device_id: no device {device_id!r} in the controller store", "device_id")
        return Response(200, answered.to_dict())

    return [
        Route("POST", "/api/v1/devices/{device_id}/logs", Role.OPERATOR,
              "Ask a device for its recent log lines (signed logs command) and wait for its answer: the newest `lines`, "
              "or those between `since` and `until`, at `level` or above; redacted of secrets, at most 64 KiB.", ask,
              body=ASK_SCHEMA, responses={200: "The device's answer", 400: "Bad body (names the field); nothing sent",
                                          404: "No such device", 409: "Decommissioned",
                                          504: "No answer in time (says whether the request was sent)"},
              tag="devices", answer=ANSWER_SCHEMA),
        Route("GET", "/api/v1/devices/{device_id}/logs", Role.OPERATOR,
              "The latest answer a device gave to a logs request (any replica's).", latest,
              responses={200: "The latest answer", 404: "No such device, or no logs fetched yet"}, tag="devices",
              answer=ANSWER_SCHEMA),
    ]
