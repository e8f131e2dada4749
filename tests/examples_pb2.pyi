from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class PageView(_message.Message):
    __slots__ = ("uuid", "session", "page", "duration_ms")
    UUID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    uuid: bytes
    session: str
    page: str
    duration_ms: int
    def __init__(self, uuid: _Optional[bytes] = ..., session: _Optional[str] = ..., page: _Optional[str] = ..., duration_ms: _Optional[int] = ...) -> None: ...

class PageViewText(_message.Message):
    __slots__ = ("uuid", "session", "page", "duration_ms")
    UUID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    session: str
    page: str
    duration_ms: int
    def __init__(self, uuid: _Optional[str] = ..., session: _Optional[str] = ..., page: _Optional[str] = ..., duration_ms: _Optional[int] = ...) -> None: ...
