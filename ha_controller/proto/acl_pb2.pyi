from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AclUser(_message.Message):
    __slots__ = ("username", "password", "user_type", "user_status")
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    USER_TYPE_FIELD_NUMBER: _ClassVar[int]
    USER_STATUS_FIELD_NUMBER: _ClassVar[int]
    username: str
    password: str
    user_type: str
    user_status: str
    def __init__(self, username: _Optional[str] = ..., password: _Optional[str] = ..., user_type: _Optional[str] = ..., user_status: _Optional[str] = ...) -> None: ...

class AclPolicyEntry(_message.Message):
    __slots__ = ("resource", "actions", "source_ips", "decision")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_IPS_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    resource: str
    actions: _containers.RepeatedScalarFieldContainer[str]
    source_ips: _containers.RepeatedScalarFieldContainer[str]
    decision: str
    def __init__(self, resource: _Optional[str] = ..., actions: _Optional[_Iterable[str]] = ..., source_ips: _Optional[_Iterable[str]] = ..., decision: _Optional[str] = ...) -> None: ...

class AclSubject(_message.Message):
    __slots__ = ("subject", "entries")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    subject: str
    entries: _containers.RepeatedCompositeFieldContainer[AclPolicyEntry]
    def __init__(self, subject: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[AclPolicyEntry, _Mapping]]] = ...) -> None: ...

class AclTable(_message.Message):
    __slots__ = ("revision", "digest", "users", "acls", "updated_ms")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    USERS_FIELD_NUMBER: _ClassVar[int]
    ACLS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_MS_FIELD_NUMBER: _ClassVar[int]
    revision: int
    digest: str
    users: _containers.RepeatedCompositeFieldContainer[AclUser]
    acls: _containers.RepeatedCompositeFieldContainer[AclSubject]
    updated_ms: int
    def __init__(self, revision: _Optional[int] = ..., digest: _Optional[str] = ..., users: _Optional[_Iterable[_Union[AclUser, _Mapping]]] = ..., acls: _Optional[_Iterable[_Union[AclSubject, _Mapping]]] = ..., updated_ms: _Optional[int] = ...) -> None: ...

class AclTableQuery(_message.Message):
    __slots__ = ("revision", "digest")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    revision: int
    digest: str
    def __init__(self, revision: _Optional[int] = ..., digest: _Optional[str] = ...) -> None: ...

class AclTableAnswer(_message.Message):
    __slots__ = ("newer", "table", "revision", "digest")
    NEWER_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    newer: bool
    table: AclTable
    revision: int
    digest: str
    def __init__(self, newer: _Optional[bool] = ..., table: _Optional[_Union[AclTable, _Mapping]] = ..., revision: _Optional[int] = ..., digest: _Optional[str] = ...) -> None: ...

class UserRequest(_message.Message):
    __slots__ = ("user",)
    USER_FIELD_NUMBER: _ClassVar[int]
    user: AclUser
    def __init__(self, user: _Optional[_Union[AclUser, _Mapping]] = ...) -> None: ...

class UserQuery(_message.Message):
    __slots__ = ("username", "filter")
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    username: str
    filter: str
    def __init__(self, username: _Optional[str] = ..., filter: _Optional[str] = ...) -> None: ...

class UserList(_message.Message):
    __slots__ = ("users", "revision")
    USERS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedCompositeFieldContainer[AclUser]
    revision: int
    def __init__(self, users: _Optional[_Iterable[_Union[AclUser, _Mapping]]] = ..., revision: _Optional[int] = ...) -> None: ...

class AclRequest(_message.Message):
    __slots__ = ("subject", "entries")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    subject: str
    entries: _containers.RepeatedCompositeFieldContainer[AclPolicyEntry]
    def __init__(self, subject: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[AclPolicyEntry, _Mapping]]] = ...) -> None: ...

class AclQuery(_message.Message):
    __slots__ = ("subject", "resource", "subject_filter", "resource_filter")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FILTER_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FILTER_FIELD_NUMBER: _ClassVar[int]
    subject: str
    resource: str
    subject_filter: str
    resource_filter: str
    def __init__(self, subject: _Optional[str] = ..., resource: _Optional[str] = ..., subject_filter: _Optional[str] = ..., resource_filter: _Optional[str] = ...) -> None: ...

class AclList(_message.Message):
    __slots__ = ("acls", "revision")
    ACLS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    acls: _containers.RepeatedCompositeFieldContainer[AclSubject]
    revision: int
    def __init__(self, acls: _Optional[_Iterable[_Union[AclSubject, _Mapping]]] = ..., revision: _Optional[int] = ...) -> None: ...

class AclChange(_message.Message):
    __slots__ = ("revision", "digest")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    revision: int
    digest: str
    def __init__(self, revision: _Optional[int] = ..., digest: _Optional[str] = ...) -> None: ...
