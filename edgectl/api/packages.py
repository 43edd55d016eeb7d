"""``/api/v1/packages``: upload a signed ``.edgepkg`` (verified against the trusted keys; never signed here), list them."""

from __future__ import annotations

from typing import Any

from edgecore.errors import NotFoundError, UserError, VerificationError
from edgectl.api.context import ApiContext
from edgectl.api.router import ApiError, Request, Response, Route
from edgectl.controller.accounts import Role
from edgectl.controller.queries import UploadedPackage
from edgectl.fleet import upload_package
from edgectl.fleet.lifecycle import InUse, delete_package

__all__ = ["package_routes"]


def _public(package: UploadedPackage) -> dict[str, Any]:
    """A package as the API shows it: where the controller keeps the file is its own business."""
    return {key: value for key, value in package.to_dict().items() if key != "path"}


def package_routes(ctx: ApiContext) -> list[Route]:
    def list_packages(_request: Request) -> Response:
        with ctx.timer.time("packages"):
            return Response(200, {"packages": [_public(p) for p in ctx.store.packages()]})

    def upload(request: Request) -> Response:
        assert request.upload is not None  # the server streams an upload route's body to a file
        try:
            uploaded = upload_package(ctx.store, request.upload, ctx.trusted(), request.actor, ctx.max_upload_bytes)
        except VerificationError as exc:
            raise ApiError(422, str(exc)) from None
        return Response(201, _public(uploaded))

    def delete(request: Request) -> Response:
        variant = request.path_params["variant"]
        try:
            deleted = delete_package(ctx.store, variant, request.actor)
        except InUse as exc:
            raise ApiError(409, str(exc), "variant") from None
        except NotFoundError:
            raise
        except UserError as exc:
            raise ApiError(400, str(exc), "variant") from None
        return Response(200, {"deleted": _public(deleted)})

    return [
        Route("GET", "/api/v1/packages", Role.VIEWER, "List uploaded packages.", list_packages, tag="packages"),
        Route("DELETE", "/api/v1/packages/{variant}", Role.OPERATOR,
              "Delete an uploaded package and its kept file, unless a rollout (in any status, finished ones included) "
              "names it.", delete, responses={200: "Deleted", 400: "Not a variant id", 404: "No such uploaded package",
                                              409: "Rollouts name it (the message lists them)"}, tag="packages"),
        Route("POST", "/api/v1/packages", Role.OPERATOR,
              "Upload a signed .edgepkg (the raw file as the body); it is verified with the trusted package keys.", upload,
              upload="application/octet-stream",
              responses={201: "Verified and kept", 400: "Not a package, or malformed", 413: "Over the upload limit",
                         422: "Signature, hash or expiry check failed"}, tag="packages"),
    ]
