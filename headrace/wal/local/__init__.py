"""Local segmented-file WAL backend (the embedded default); registers ``local``."""

from headrace.wal import registry
from headrace.wal.local.backend import LocalBackend, create
from headrace.wal.local.message_id import LocalMessageID

registry.register("local", create)

__all__ = ["LocalBackend", "LocalMessageID", "create"]
