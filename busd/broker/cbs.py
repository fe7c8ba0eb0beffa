"""`$cbs`: claims-based security. The client puts a SAS token for an audience; busd verifies it
(HMAC-SHA256, key name, expiry) and records the grant on the connection (docs/wire.md §3).

Expiry is checked here and at attach time only: live links are not torn down when a token
lapses, because the SDK refreshes tokens only while user code drives it (docs/wire.md §3.5).
"""

from __future__ import annotations

import logging

from busd.amqp import codec
from busd.auth import sas
from busd.broker.nodes import RequestEndpoint

log = logging.getLogger("busd.auth")


class CbsEndpoint(RequestEndpoint):
    reply_key = "$cbs"

    async def handle(self, payload: bytes):
        try:
            request = codec.decode_message(payload)
        except codec.CodecError as exc:
            log.info("cbs: undecodable request from %s: %s", self.conn.proto.peer, exc)
            return None, None
        props = request.application_properties or {}
        message_id = request.properties.get("message_id")
        operation = props.get("operation")
        if operation != "put-token":
            return _response(message_id, 400, f"Unsupported CBS operation {operation!r}."), None
        audience = str(props.get("name") or "")
        token = request.body if isinstance(request.body, str) else None
        if token is None and isinstance(request.body, bytes):
            token = request.body.decode("utf-8", "replace")
        try:
            grant = sas.verify_sas_token(token or "", self.broker.sas_keys)
        except sas.SasError as exc:
            log.warning(
                "authentication refused: peer=%s container=%s audience=%s: %s",
                self.conn.proto.peer,
                self.conn.remote_container,
                audience,
                exc,
            )
            if self.broker.metrics is not None:
                self.broker.metrics.auth_refused()
            return _response(message_id, 401, str(exc), error=True), None
        # The grant is for the audience the token was signed for, whatever `name` says.
        self.conn.grant(grant.audience, grant.expiry)
        return _response(message_id, 202, "Accepted"), None


def _response(message_id, status: int, description: str, *, error: bool = False) -> bytes:
    app = {"status-code": codec.Int(status), "status-description": description}
    if error:
        # Its mere presence marks the put as failed (docs/wire.md §3.4).
        app["error-condition"] = codec.Symbol("amqp:unauthorized-access")
    return codec.encode_message(
        properties={"correlation_id": message_id}, application_properties=app
    )
