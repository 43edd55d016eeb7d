"""``/api/v1/devices/{device_id}/config``: a device's desired configuration and what the device reports of it."""

from __future__ import annotations

from typing import Any

from edgecore.errors import UserError
from edgecore.protocol.device_config import CONFIG_KEYS
from edgectl.api.context import ApiContext
from edgectl.api.router import ApiError, Request, Response, Route
from edgectl.controller.accounts import Role
from edgectl.fleet.device_config import ConfigInputError, device_config_view, set_device_config, set_group_config

__all__ = ["SET_SCHEMA", "device_config_routes"]

SET_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["settings"],
    "properties": {"settings": {
        "type": "object", "description": "The whole new version: keys left out go back to the device's agent.yaml. "
        + "; ".join(f"`{key}`: {what}" for key, what in CONFIG_KEYS.items()) + "."}},
}
VIEW_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "device_id": {"type": "string"},
        "desired": {"type": "object", "nullable": True, "description": "The version the operators set (null: none): "
                    "version, settings, updated_by, updated_at, published (the engine leader published it)."},
        "reported": {"type": "object", "nullable": True, "description": "The device's state `config`: the newest version "
                     "it handled, status applied or refused, reason, applied_version (null: nothing reported)."},
        "sync": {"type": "string", "enum": ["none", "pending", "in sync", "refused"]},
    },
}


def device_config_routes(ctx: ApiContext) -> list[Route]:
    def show(request: Request) -> Response:
        return Response(200, device_config_view(ctx.store, request.path_params["device_id"]))

    def put(request: Request) -> Response:
        device_id = request.path_params["device_id"]
        try:
            set_device_config(ctx.store, device_id, request.values["body"]["settings"], request.actor)
        except ConfigInputError as exc:
            raise ApiError(400, str(exc), exc.field) from None
        return Response(200, device_config_view(ctx.store, device_id))

    def put_group(request: Request) -> Response:
        try:
            stored = set_group_config(ctx.store, request.path_params["name"], request.values["body"]["settings"],
                                      request.actor)
        except ConfigInputError as exc:
            raise ApiError(400, str(exc), exc.field) from None
        except UserError as exc:
            if "resolves to no device" not in str(exc):
                raise
            raise ApiError(409, str(exc), "name") from None
        return Response(200, {"group": request.path_params["name"],
                              "devices": [{"device_id": d.device_id, "version": d.version} for d in stored]})

    return [
        Route("GET", "/api/v1/devices/{device_id}/config", Role.VIEWER,
              "A device's desired configuration, what the device reports of it, and whether they agree.", show,
              responses={200: "OK", 404: "No such device"}, tag="devices", answer=VIEW_SCHEMA),
        Route("PUT", "/api/v1/devices/{device_id}/config", Role.OPERATOR,
              "Set a device's configuration (the next version; signed and published retained by the controller).", put,
              body=SET_SCHEMA, responses={200: "Stored (the answer is as GET's)", 400: "Bad settings (names the field); "
                                          "nothing stored", 404: "No such device", 409: "Decommissioned"},
              tag="devices", answer=VIEW_SCHEMA),
        Route("PUT", "/api/v1/groups/{name}/config", Role.OPERATOR,
              "Set the configuration of every device the group resolves to now (each device's next version; a device "
              "joining later gets none).", put_group, body=SET_SCHEMA,
              responses={200: "Stored: each device and its new version", 400: "Bad settings (names the field); nothing "
                         "stored", 404: "No such group", 409: "The group resolves to no device now"}, tag="groups"),
    ]
