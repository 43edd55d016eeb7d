"""The controller's REST API (``/api/v1``), its OpenAPI document, bearer tokens with roles, and ``/metrics``.

Endpoints call the fleet domain layer (:mod:`edgectl.fleet`) that the CLI calls; nothing here plans,
gates or steers a rollout by itself. docs/api.md describes the endpoints, roles and examples.
"""

from __future__ import annotations

from edgectl.api.accounts import Accounts, Principal
from edgectl.api.app import api_context, api_routes, start_api
from edgectl.api.openapi import openapi_document
from edgectl.api.server import ApiServer

__all__ = ["Accounts", "ApiServer", "Principal", "api_context", "api_routes", "openapi_document", "start_api"]
