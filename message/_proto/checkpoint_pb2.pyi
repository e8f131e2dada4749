from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Checkpoint(_message.Message):
    __slots__ = ("sources", "ack_intents")
    class Source(_message.Message):
        __slots__ = ("read_through", "producers")
        class ProducerEntry(_message.Message):
            __slots__ = ("id", "state")
            ID_FIELD_NUMBER: _ClassVar[int]
            STATE_FIELD_NUMBER: _ClassVar[int]
            id: bytes
            state: Checkpoint.ProducerState
            def __init__(self, id: _Optional[bytes] = ..., state: _Optional[_Union[Checkpoint.ProducerState, _Mapping]] = ...) -> None: ...
        READ_THROUGH_FIELD_NUMBER: _ClassVar[int]
        PRODUCERS_FIELD_NUMBER: _ClassVar[int]
        read_through: int
        producers: _containers.RepeatedCompositeFieldContainer[Checkpoint.Source.ProducerEntry]
        def __init__(self, read_through: _Optional[int] = ..., producers: _Optional[_Iterable[_Union[Checkpoint.Source.ProducerEntry, _Mapping]]] = ...) -> None: ...
    class ProducerState(_message.Message):
        __slots__ = ("last_ack", "begin")
        LAST_ACK_FIELD_NUMBER: _ClassVar[int]
        BEGIN_FIELD_NUMBER: _ClassVar[int]
        last_ack: int
        begin: int
        def __init__(self, last_ack: _Optional[int] = ..., begin: _Optional[int] = ...) -> None: ...
    class SourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Checkpoint.Source
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Checkpoint.Source, _Mapping]] = ...) -> None: ...
    class AckIntentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    ACK_INTENTS_FIELD_NUMBER: _ClassVar[int]
    sources: _containers.MessageMap[str, Checkpoint.Source]
    ack_intents: _containers.ScalarMap[str, bytes]
    def __init__(self, sources: _Optional[_Mapping[str, Checkpoint.Source]] = ..., ack_intents: _Optional[_Mapping[str, bytes]] = ...) -> None: ...
