"""`$cbs`: claims-based security. The client puts a SAS token for an audience; busd verifies it
(HMAC-SHA256, key name, expiry) with the namespace's keys, or with those of the entity the
audience names (its own shared access rules), and records the grant, with its key's rights, on
the connection (docs/wire.md §3).

A token for an entity that does not exist is answered 404, as Service Bus does; only a validly
signed token learns that, so names cannot be enumerated without a key. When a token expires,
the connection detaches the links it covered unless a new token was put in time
(busd.broker.links.connection).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from busd.amqp import codec
from busd.amqp.addresses import AddressError, parse_address
from busd.auth import rights, sas
from busd.broker.links.nodes import RequestEndpoint
from busd.broker.links.unknown_entities import UNKNOWN_ENTITIES
from busd.broker.namespaces import NamespaceLimit

if TYPE_CHECKING:
    from busd.broker.links.base import BrokerScope

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
        namespaces = self.conn.namespaces
        try:
            if namespaces is None:
                broker: BrokerScope = self.broker
                grant = rights.grant_of(
                    token or "", broker.sas_keys, entity_keys=broker.catalog.access_keys
                )
            else:  # the namespace the host or the key name chose (docs/design.md §3.17)
                broker, grant = await namespaces.authenticate(token or "", self.conn.host_namespace)
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
            return _response(message_id, 401, str(exc)), None
        except NamespaceLimit as exc:  # a quota, as Service Bus answers one: 403
            log.warning("namespace refused: peer=%s: %s", self.conn.proto.peer, exc.reason)
            return _response(message_id, 403, exc.reason), None
        if not self.conn.bind(broker):
            return _response(
                message_id,
                401,
                "A connection serves one namespace: this token "
                "is for another one than the connection's earlier tokens.",
            ), None
        # The grant is for the audience the token was signed for, whatever `name` says.
        if not self._exists(grant):
            UNKNOWN_ENTITIES.note(
                sas.entity_path_of(grant.audience),
                self.conn.proto.peer,
                self.conn.remote_container,
                "a put-token",
            )
            return _response(
                message_id, 404, f"The messaging entity '{grant.audience}' could not be found."
            ), None
        self.conn.grant(grant)
        return _response(message_id, 202, "Accepted"), None

    def _exists(self, grant: rights.Grant) -> bool:
        """Whether the entity the token is for exists; a namespace-wide token always does."""
        path = sas.entity_path_of(grant.audience)
        if not path:
            return True
        try:
            return self.broker.has_entity(parse_address(path))
        except AddressError:
            return False


def _response(message_id, status: int, description: str) -> bytes:
    # Refusals carry no `error-condition`, as Service Bus's: the status code says it, and the
    # SDK then shows the code and description in its exception (docs/wire.md §3.4).
    app = {"status-code": codec.Int(status), "status-description": description}
    return codec.encode_message(
        properties={"correlation_id": message_id}, application_properties=app
    )
