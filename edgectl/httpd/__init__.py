"""The host's HTTP/1.1 servers (the REST API, the artifact origin): asyncio connections parsed by llhttp, bounded.

Header, idle, body and send timeouts, connection limits per process and per address, and TLS
handshakes on the loop with a timeout (docs/security.md, "Servers").
"""

from edgectl.httpd.connection import Body, FileBody, Reply
from edgectl.httpd.limits import ServerLimits
from edgectl.httpd.request import HttpError, RequestHead
from edgectl.httpd.server import HttpServer

__all__ = ["Body", "FileBody", "HttpError", "HttpServer", "Reply", "RequestHead", "ServerLimits"]
