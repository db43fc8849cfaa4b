"""In-memory WAL backend (a fake for tests); registers itself as ``memory``."""

from headrace.wal import registry
from headrace.wal.memory.backend import MemoryBackend, MemoryStore
from headrace.wal.memory.message_id import MemoryMessageID

registry.register("memory", MemoryBackend)

__all__ = ["MemoryBackend", "MemoryMessageID", "MemoryStore"]
