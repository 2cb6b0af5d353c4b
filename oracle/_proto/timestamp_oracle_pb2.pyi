from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class GetTimestampsRequest(_message.Message):
    __slots__ = ("count",)
    COUNT_FIELD_NUMBER: _ClassVar[int]
    count: int
    def __init__(self, count: _Optional[int] = ...) -> None: ...

class GetTimestampsResponse(_message.Message):
    __slots__ = ("first", "count")
    FIRST_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    first: int
    count: int
    def __init__(self, first: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("leader", "persisted_ceiling", "served", "requests", "allocations", "address", "mode")
    LEADER_FIELD_NUMBER: _ClassVar[int]
    PERSISTED_CEILING_FIELD_NUMBER: _ClassVar[int]
    SERVED_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    leader: bool
    persisted_ceiling: int
    served: int
    requests: int
    allocations: int
    address: str
    mode: str
    def __init__(self, leader: _Optional[bool] = ..., persisted_ceiling: _Optional[int] = ..., served: _Optional[int] = ..., requests: _Optional[int] = ..., allocations: _Optional[int] = ..., address: _Optional[str] = ..., mode: _Optional[str] = ...) -> None: ...
