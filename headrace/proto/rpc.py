"""Typed entry points to the generated gRPC module, which has no type stubs.

Node and client code use these instead of ``streaming_pb2_grpc`` directly, so
``mypy --strict`` checks the requests and responses they pass.
"""

from __future__ import annotations

from typing import Any, Protocol, cast

import grpc

from headrace.proto import streaming_pb2 as pb
from headrace.proto import streaming_pb2_grpc as pb_grpc

ProduceCall = grpc.aio.StreamStreamCall[pb.ProduceRequest, pb.ProduceResponse]
ConsumeCall = grpc.aio.UnaryStreamCall[pb.ConsumeRequest, pb.ConsumeResponse]

ProducerServicer = pb_grpc.ProducerServicer
ConsumerServicer = pb_grpc.ConsumerServicer
ManagerServicer = pb_grpc.ManagerServicer


class ProducerStub(Protocol):
    def Produce(self, *, timeout: float | None = None) -> ProduceCall: ...


class ConsumerStub(Protocol):
    def Consume(
        self, request: pb.ConsumeRequest, *, timeout: float | None = None
    ) -> ConsumeCall: ...


class ManagerStub(Protocol):
    def OpenWAL(
        self, request: pb.OpenWALRequest, *, timeout: float | None = None
    ) -> grpc.aio.UnaryUnaryCall[pb.OpenWALRequest, pb.OpenWALResponse]: ...

    def CloseWAL(
        self, request: pb.CloseWALRequest, *, timeout: float | None = None
    ) -> grpc.aio.UnaryUnaryCall[pb.CloseWALRequest, pb.CloseWALResponse]: ...

    def ListWALs(
        self, request: pb.ListWALsRequest, *, timeout: float | None = None
    ) -> grpc.aio.UnaryUnaryCall[pb.ListWALsRequest, pb.ListWALsResponse]: ...


_generated: Any = pb_grpc


def producer_stub(channel: grpc.aio.Channel) -> ProducerStub:
    return cast(ProducerStub, _generated.ProducerStub(channel))


def consumer_stub(channel: grpc.aio.Channel) -> ConsumerStub:
    return cast(ConsumerStub, _generated.ConsumerStub(channel))


def manager_stub(channel: grpc.aio.Channel) -> ManagerStub:
    return cast(ManagerStub, _generated.ManagerStub(channel))


def add_services(
    server: grpc.aio.Server,
    producer: ProducerServicer,
    consumer: ConsumerServicer,
    manager: ManagerServicer,
) -> None:
    """Register the three Headrace services on ``server``."""
    _generated.add_ProducerServicer_to_server(producer, server)
    _generated.add_ConsumerServicer_to_server(consumer, server)
    _generated.add_ManagerServicer_to_server(manager, server)
