"""Generated gRPC modules of the streaming node API (package ``headrace.v1``).

``streaming.proto`` is the source; ``scripts/gen_proto.sh`` regenerates
``streaming_pb2.py``, ``streaming_pb2.pyi`` and ``streaming_pb2_grpc.py``, and
``tests/test_proto_fresh.py`` fails when they are out of date.
"""
