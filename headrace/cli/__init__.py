"""The ``headrace`` command line.

Its processes run gRPC as :func:`headrace.runtime.tune_grpc` says, set here,
before any of its modules imports grpc.
"""

from headrace import runtime

runtime.tune_grpc()
