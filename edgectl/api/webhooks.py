"""``/api/v1/webhooks``: subscriptions to rollout and device events, and their delivery log (docs/integrations.md).

Changes need an admin; reading needs an operator (a webhook's URL may carry a token of its receiver's).
A secret is answered once, by the create call; afterwards only its hint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edgectl.api.context import ApiContext
from edgectl.api.router import ApiError, Param, Request, Response, Route
from edgectl.controller.accounts import Role
from edgectl.controller.webhooks import EVENT_TYPES, MAX_URL, DeliveryStatus, WebhookInputError
from edgectl.fleet.webhooks import add_webhook, find_webhook, redeliver, remove_webhook, webhook_deliveries

__all__ = ["CREATE_SCHEMA", "webhook_routes"]

CREATE_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["url", "events"],
    "properties": {
        "url": {"type": "string", "minLength": 1, "description": f"Where events are POSTed: http:// or https://, "
                f"no credentials, at most {MAX_URL} characters. Redirects are not followed."},
        "events": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1},
                   "description": f"Event types, prefixes (rollout.*) or * for all. Types: {', '.join(EVENT_TYPES)}."},
        "secret": {"type": "string", "description": "The HMAC key (16-256 printable characters); none: a random one, "
                   "answered once."},
    },
}
DELIVERY_PARAMS = (
    Param("status", "string", "Only deliveries in this status.", enum=tuple(s.value for s in DeliveryStatus)),
    Param("limit", "integer", "Newest deliveries to return.", minimum=1, maximum=1000, default=100),
)


def _fields(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except WebhookInputError as exc:
        raise ApiError(400, str(exc), exc.field) from None


def webhook_routes(ctx: ApiContext) -> list[Route]:
    def list_webhooks(_request: Request) -> Response:
        return Response(200, {"webhooks": [h.to_dict() for h in ctx.store.webhooks()]})

    def create(request: Request) -> Response:
        body = request.values["body"]
        hook, secret = _fields(lambda: add_webhook(ctx.store, body["url"], body["events"], body.get("secret"), request.actor))
        return Response(201, {**hook.to_dict(), "secret": secret})

    def show(request: Request) -> Response:
        return Response(200, find_webhook(ctx.store, request.path_params["webhook_id"]).to_dict())

    def delete(request: Request) -> Response:
        hook = remove_webhook(ctx.store, request.path_params["webhook_id"], request.actor)
        return Response(200, {"removed": hook.id})

    def deliveries(request: Request) -> Response:
        v = request.values
        status = None if v["status"] is None else DeliveryStatus(v["status"])
        found = webhook_deliveries(ctx.store, request.path_params["webhook_id"], status, v["limit"])
        return Response(200, {"deliveries": [d.to_dict() for d in found]})

    def send_again(request: Request) -> Response:
        webhook_id, delivery_id = request.path_params["webhook_id"], request.path_params["delivery_id"]
        old = ctx.store.delivery(delivery_id)
        if old is None or old.webhook_id != webhook_id:
            raise ApiError(404, f"webhook {webhook_id!r} has no delivery {delivery_id!r}")
        return Response(202, redeliver(ctx.store, delivery_id, request.actor).to_dict())

    one = "/api/v1/webhooks/{webhook_id}"
    return [
        Route("GET", "/api/v1/webhooks", Role.OPERATOR, "List webhooks (never their secrets: a hint).", list_webhooks,
              tag="webhooks"),
        Route("POST", "/api/v1/webhooks", Role.ADMIN, "Add a webhook; the answer holds its secret, once.", create,
              body=CREATE_SCHEMA, responses={201: "Added", 400: "Bad body (names the field)"}, tag="webhooks"),
        Route("GET", one, Role.OPERATOR, "One webhook.", show, responses={200: "OK", 404: "No such webhook"}, tag="webhooks"),
        Route("DELETE", one, Role.ADMIN, "Remove a webhook and its delivery log.", delete,
              responses={200: "Removed", 404: "No such webhook"}, tag="webhooks"),
        Route("GET", one + "/deliveries", Role.OPERATOR, "A webhook's deliveries, newest first: attempts, last status "
              "code or error, next attempt.", deliveries, DELIVERY_PARAMS, responses={200: "OK", 404: "No such webhook"},
              tag="webhooks"),
        Route("POST", one + "/deliveries/{delivery_id}/redeliver", Role.ADMIN, "Send a delivery's event again (a new "
              "delivery with the same body, due now).", send_again,
              responses={202: "Queued; the controller sends it within a second", 404: "No such delivery"}, tag="webhooks"),
    ]
