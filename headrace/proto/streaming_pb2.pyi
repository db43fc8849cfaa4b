from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DeliverPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DELIVER_POLICY_UNSPECIFIED: _ClassVar[DeliverPolicy]
    DELIVER_POLICY_ALL: _ClassVar[DeliverPolicy]
    DELIVER_POLICY_LATEST: _ClassVar[DeliverPolicy]
    DELIVER_POLICY_START_FROM: _ClassVar[DeliverPolicy]
    DELIVER_POLICY_START_AFTER: _ClassVar[DeliverPolicy]
DELIVER_POLICY_UNSPECIFIED: DeliverPolicy
DELIVER_POLICY_ALL: DeliverPolicy
DELIVER_POLICY_LATEST: DeliverPolicy
DELIVER_POLICY_START_FROM: DeliverPolicy
DELIVER_POLICY_START_AFTER: DeliverPolicy

class Error(_message.Message):
    __slots__ = ("code", "message", "retryable", "owner", "owner_address", "term", "current_term", "earliest")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    OWNER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    CURRENT_TERM_FIELD_NUMBER: _ClassVar[int]
    EARLIEST_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    retryable: bool
    owner: str
    owner_address: str
    term: int
    current_term: int
    earliest: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., retryable: _Optional[bool] = ..., owner: _Optional[str] = ..., owner_address: _Optional[str] = ..., term: _Optional[int] = ..., current_term: _Optional[int] = ..., earliest: _Optional[str] = ...) -> None: ...

class ProduceMessage(_message.Message):
    __slots__ = ("type", "vchannel", "payload", "properties", "txn_id")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TYPE_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    type: int
    vchannel: str
    payload: bytes
    properties: _containers.ScalarMap[str, str]
    txn_id: int
    def __init__(self, type: _Optional[int] = ..., vchannel: _Optional[str] = ..., payload: _Optional[bytes] = ..., properties: _Optional[_Mapping[str, str]] = ..., txn_id: _Optional[int] = ...) -> None: ...

class OpenProducer(_message.Message):
    __slots__ = ("pchannel", "term", "producer_id")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    term: int
    producer_id: str
    def __init__(self, pchannel: _Optional[str] = ..., term: _Optional[int] = ..., producer_id: _Optional[str] = ...) -> None: ...

class ProduceBatch(_message.Message):
    __slots__ = ("batch_id", "messages", "record_batches")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    RECORD_BATCHES_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    messages: _containers.RepeatedCompositeFieldContainer[ProduceMessage]
    record_batches: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, batch_id: _Optional[int] = ..., messages: _Optional[_Iterable[_Union[ProduceMessage, _Mapping]]] = ..., record_batches: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ProduceRequest(_message.Message):
    __slots__ = ("open", "batch")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    open: OpenProducer
    batch: ProduceBatch
    def __init__(self, open: _Optional[_Union[OpenProducer, _Mapping]] = ..., batch: _Optional[_Union[ProduceBatch, _Mapping]] = ...) -> None: ...

class ProducerOpened(_message.Message):
    __slots__ = ("pchannel", "term", "node_id", "max_message_bytes", "message_format", "max_batch_bytes")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FORMAT_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_BYTES_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    term: int
    node_id: str
    max_message_bytes: int
    message_format: int
    max_batch_bytes: int
    def __init__(self, pchannel: _Optional[str] = ..., term: _Optional[int] = ..., node_id: _Optional[str] = ..., max_message_bytes: _Optional[int] = ..., message_format: _Optional[int] = ..., max_batch_bytes: _Optional[int] = ...) -> None: ...

class MessageResult(_message.Message):
    __slots__ = ("id", "timetick", "term", "txn_id", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    TIMETICK_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: str
    timetick: int
    term: int
    txn_id: int
    error: Error
    def __init__(self, id: _Optional[str] = ..., timetick: _Optional[int] = ..., term: _Optional[int] = ..., txn_id: _Optional[int] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class RecordBatchResult(_message.Message):
    __slots__ = ("id", "count", "timetick", "term", "txn_id", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TIMETICK_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: str
    count: int
    timetick: int
    term: int
    txn_id: int
    error: Error
    def __init__(self, id: _Optional[str] = ..., count: _Optional[int] = ..., timetick: _Optional[int] = ..., term: _Optional[int] = ..., txn_id: _Optional[int] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class BatchResult(_message.Message):
    __slots__ = ("batch_id", "results", "batch_results")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    BATCH_RESULTS_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    results: _containers.RepeatedCompositeFieldContainer[MessageResult]
    batch_results: _containers.RepeatedCompositeFieldContainer[RecordBatchResult]
    def __init__(self, batch_id: _Optional[int] = ..., results: _Optional[_Iterable[_Union[MessageResult, _Mapping]]] = ..., batch_results: _Optional[_Iterable[_Union[RecordBatchResult, _Mapping]]] = ...) -> None: ...

class ProduceResponse(_message.Message):
    __slots__ = ("opened", "batch")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    opened: ProducerOpened
    batch: BatchResult
    def __init__(self, opened: _Optional[_Union[ProducerOpened, _Mapping]] = ..., batch: _Optional[_Union[BatchResult, _Mapping]] = ...) -> None: ...

class ConsumeRequest(_message.Message):
    __slots__ = ("pchannel", "policy", "start_id", "vchannels", "types", "timetick_gt", "timetick_ge", "max_batch_messages", "max_batch_bytes", "accept_batches")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    START_ID_FIELD_NUMBER: _ClassVar[int]
    VCHANNELS_FIELD_NUMBER: _ClassVar[int]
    TYPES_FIELD_NUMBER: _ClassVar[int]
    TIMETICK_GT_FIELD_NUMBER: _ClassVar[int]
    TIMETICK_GE_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_BYTES_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_BATCHES_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    policy: DeliverPolicy
    start_id: str
    vchannels: _containers.RepeatedScalarFieldContainer[str]
    types: _containers.RepeatedScalarFieldContainer[int]
    timetick_gt: int
    timetick_ge: int
    max_batch_messages: int
    max_batch_bytes: int
    accept_batches: bool
    def __init__(self, pchannel: _Optional[str] = ..., policy: _Optional[_Union[DeliverPolicy, str]] = ..., start_id: _Optional[str] = ..., vchannels: _Optional[_Iterable[str]] = ..., types: _Optional[_Iterable[int]] = ..., timetick_gt: _Optional[int] = ..., timetick_ge: _Optional[int] = ..., max_batch_messages: _Optional[int] = ..., max_batch_bytes: _Optional[int] = ..., accept_batches: _Optional[bool] = ...) -> None: ...

class ConsumedMessage(_message.Message):
    __slots__ = ("id", "type", "vchannel", "timetick", "term", "txn_id", "properties", "payload")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    VCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TIMETICK_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    id: str
    type: int
    vchannel: str
    timetick: int
    term: int
    txn_id: int
    properties: _containers.ScalarMap[str, str]
    payload: bytes
    def __init__(self, id: _Optional[str] = ..., type: _Optional[int] = ..., vchannel: _Optional[str] = ..., timetick: _Optional[int] = ..., term: _Optional[int] = ..., txn_id: _Optional[int] = ..., properties: _Optional[_Mapping[str, str]] = ..., payload: _Optional[bytes] = ...) -> None: ...

class ConsumedBatch(_message.Message):
    __slots__ = ("first_id", "data")
    FIRST_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    first_id: str
    data: bytes
    def __init__(self, first_id: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class ConsumedItem(_message.Message):
    __slots__ = ("message", "batch")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    message: ConsumedMessage
    batch: ConsumedBatch
    def __init__(self, message: _Optional[_Union[ConsumedMessage, _Mapping]] = ..., batch: _Optional[_Union[ConsumedBatch, _Mapping]] = ...) -> None: ...

class ConsumeResponse(_message.Message):
    __slots__ = ("messages", "node_id", "term", "start_after_id", "start_after_timetick", "items")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    START_AFTER_ID_FIELD_NUMBER: _ClassVar[int]
    START_AFTER_TIMETICK_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ConsumedMessage]
    node_id: str
    term: int
    start_after_id: str
    start_after_timetick: int
    items: _containers.RepeatedCompositeFieldContainer[ConsumedItem]
    def __init__(self, messages: _Optional[_Iterable[_Union[ConsumedMessage, _Mapping]]] = ..., node_id: _Optional[str] = ..., term: _Optional[int] = ..., start_after_id: _Optional[str] = ..., start_after_timetick: _Optional[int] = ..., items: _Optional[_Iterable[_Union[ConsumedItem, _Mapping]]] = ...) -> None: ...

class WALInfo(_message.Message):
    __slots__ = ("pchannel", "term", "state", "last_id", "last_timetick", "stats")
    class StatsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LAST_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_TIMETICK_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    term: int
    state: str
    last_id: str
    last_timetick: int
    stats: _containers.ScalarMap[str, str]
    def __init__(self, pchannel: _Optional[str] = ..., term: _Optional[int] = ..., state: _Optional[str] = ..., last_id: _Optional[str] = ..., last_timetick: _Optional[int] = ..., stats: _Optional[_Mapping[str, str]] = ...) -> None: ...

class OpenWALRequest(_message.Message):
    __slots__ = ("pchannel", "term")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    term: int
    def __init__(self, pchannel: _Optional[str] = ..., term: _Optional[int] = ...) -> None: ...

class OpenWALResponse(_message.Message):
    __slots__ = ("wal",)
    WAL_FIELD_NUMBER: _ClassVar[int]
    wal: WALInfo
    def __init__(self, wal: _Optional[_Union[WALInfo, _Mapping]] = ...) -> None: ...

class CloseWALRequest(_message.Message):
    __slots__ = ("pchannel", "term")
    PCHANNEL_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    pchannel: str
    term: int
    def __init__(self, pchannel: _Optional[str] = ..., term: _Optional[int] = ...) -> None: ...

class CloseWALResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListWALsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListWALsResponse(_message.Message):
    __slots__ = ("node_id", "wals")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    WALS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    wals: _containers.RepeatedCompositeFieldContainer[WALInfo]
    def __init__(self, node_id: _Optional[str] = ..., wals: _Optional[_Iterable[_Union[WALInfo, _Mapping]]] = ...) -> None: ...
