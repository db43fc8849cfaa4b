"""The message properties that mark collection data (see :mod:`headrace.table.messages`).

Kept apart from the payload code so that the node's write path, which looks
for these properties on every message, does not load pyarrow: only a node
that receives collection data does (:mod:`headrace.table.payloads`).
"""

from __future__ import annotations

from headrace.message.types import Message, MessageType

COLLECTION = "headrace.collection"
SEGMENT = "headrace.segment"
COLLECTION_ID = "headrace.collection-id"


def is_flush_request(message: Message) -> bool:
    """A FLUSH naming a collection and no segment: ``client.flush``'s request."""
    return (
        message.type is MessageType.FLUSH
        and COLLECTION in message.properties
        and SEGMENT not in message.properties
    )
