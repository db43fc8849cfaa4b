"""The streaming node: gRPC services over the WALs it is assigned.

:class:`~headrace.node.server.StreamingNode` and
:func:`~headrace.node.server.run_node` are the entry points.
"""
