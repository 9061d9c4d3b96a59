from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Batch(_message.Message):
    __slots__ = ("ring_stamp", "token", "source", "first_seq", "last_seq", "count", "payload", "seqs", "id", "stream")
    RING_STAMP_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    SEQS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    ring_stamp: int
    token: int
    source: str
    first_seq: int
    last_seq: int
    count: int
    payload: bytes
    seqs: bytes
    id: int
    stream: int
    def __init__(self, ring_stamp: _Optional[int] = ..., token: _Optional[int] = ..., source: _Optional[str] = ..., first_seq: _Optional[int] = ..., last_seq: _Optional[int] = ..., count: _Optional[int] = ..., payload: _Optional[bytes] = ..., seqs: _Optional[bytes] = ..., id: _Optional[int] = ..., stream: _Optional[int] = ...) -> None: ...

class PushAck(_message.Message):
    __slots__ = ("id", "applied", "duplicates", "ring_stamp")
    ID_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    RING_STAMP_FIELD_NUMBER: _ClassVar[int]
    id: int
    applied: int
    duplicates: int
    ring_stamp: int
    def __init__(self, id: _Optional[int] = ..., applied: _Optional[int] = ..., duplicates: _Optional[int] = ..., ring_stamp: _Optional[int] = ...) -> None: ...

class PushRequest(_message.Message):
    __slots__ = ("batches",)
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedCompositeFieldContainer[Batch]
    def __init__(self, batches: _Optional[_Iterable[_Union[Batch, _Mapping]]] = ...) -> None: ...

class PushReply(_message.Message):
    __slots__ = ("acks",)
    ACKS_FIELD_NUMBER: _ClassVar[int]
    acks: _containers.RepeatedCompositeFieldContainer[PushAck]
    def __init__(self, acks: _Optional[_Iterable[_Union[PushAck, _Mapping]]] = ...) -> None: ...

class RingView(_message.Message):
    __slots__ = ("version", "ring", "reducer", "sender", "starting")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RING_FIELD_NUMBER: _ClassVar[int]
    REDUCER_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    STARTING_FIELD_NUMBER: _ClassVar[int]
    version: int
    ring: bytes
    reducer: str
    sender: str
    starting: bool
    def __init__(self, version: _Optional[int] = ..., ring: _Optional[bytes] = ..., reducer: _Optional[str] = ..., sender: _Optional[str] = ..., starting: _Optional[bool] = ...) -> None: ...

class GetRingRequest(_message.Message):
    __slots__ = ("expect_reducer", "starting_ok")
    EXPECT_REDUCER_FIELD_NUMBER: _ClassVar[int]
    STARTING_OK_FIELD_NUMBER: _ClassVar[int]
    expect_reducer: str
    starting_ok: bool
    def __init__(self, expect_reducer: _Optional[str] = ..., starting_ok: _Optional[bool] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("sender", "ring_stamp", "incarnation")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    RING_STAMP_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    sender: str
    ring_stamp: int
    incarnation: int
    def __init__(self, sender: _Optional[str] = ..., ring_stamp: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("sender", "ring_stamp", "incarnation")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    RING_STAMP_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    sender: str
    ring_stamp: int
    incarnation: int
    def __init__(self, sender: _Optional[str] = ..., ring_stamp: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class CheckpointFragment(_message.Message):
    __slots__ = ("sender", "ring_stamp", "token", "checkpoint_seq", "base_seq", "full", "states", "watermarks", "incarnation", "chunk", "chunks")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    RING_STAMP_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_SEQ_FIELD_NUMBER: _ClassVar[int]
    BASE_SEQ_FIELD_NUMBER: _ClassVar[int]
    FULL_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    WATERMARKS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    sender: str
    ring_stamp: int
    token: int
    checkpoint_seq: int
    base_seq: int
    full: bool
    states: bytes
    watermarks: bytes
    incarnation: int
    chunk: int
    chunks: int
    def __init__(self, sender: _Optional[str] = ..., ring_stamp: _Optional[int] = ..., token: _Optional[int] = ..., checkpoint_seq: _Optional[int] = ..., base_seq: _Optional[int] = ..., full: _Optional[bool] = ..., states: _Optional[bytes] = ..., watermarks: _Optional[bytes] = ..., incarnation: _Optional[int] = ..., chunk: _Optional[int] = ..., chunks: _Optional[int] = ...) -> None: ...

class CheckpointAck(_message.Message):
    __slots__ = ("need_full", "checkpoint_seq", "ring_stamp", "chunks_held")
    NEED_FULL_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_SEQ_FIELD_NUMBER: _ClassVar[int]
    RING_STAMP_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_HELD_FIELD_NUMBER: _ClassVar[int]
    need_full: bool
    checkpoint_seq: int
    ring_stamp: int
    chunks_held: int
    def __init__(self, need_full: _Optional[bool] = ..., checkpoint_seq: _Optional[int] = ..., ring_stamp: _Optional[int] = ..., chunks_held: _Optional[int] = ...) -> None: ...

class ProbeRequest(_message.Message):
    __slots__ = ("target", "timeout")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    target: str
    timeout: float
    def __init__(self, target: _Optional[str] = ..., timeout: _Optional[float] = ...) -> None: ...

class ProbeReply(_message.Message):
    __slots__ = ("alive",)
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    alive: bool
    def __init__(self, alive: _Optional[bool] = ...) -> None: ...

class MoveRequest(_message.Message):
    __slots__ = ("sender", "tokens", "target", "timeout")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    sender: str
    tokens: _containers.RepeatedScalarFieldContainer[int]
    target: str
    timeout: float
    def __init__(self, sender: _Optional[str] = ..., tokens: _Optional[_Iterable[int]] = ..., target: _Optional[str] = ..., timeout: _Optional[float] = ...) -> None: ...

class SplitRequest(_message.Message):
    __slots__ = ("sender", "at", "target", "timeout")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    sender: str
    at: int
    target: str
    timeout: float
    def __init__(self, sender: _Optional[str] = ..., at: _Optional[int] = ..., target: _Optional[str] = ..., timeout: _Optional[float] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("sender", "timeout")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    sender: str
    timeout: float
    def __init__(self, sender: _Optional[str] = ..., timeout: _Optional[float] = ...) -> None: ...

class ShedRequest(_message.Message):
    __slots__ = ("sender", "depth")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    sender: str
    depth: int
    def __init__(self, sender: _Optional[str] = ..., depth: _Optional[int] = ...) -> None: ...

class HandoffReply(_message.Message):
    __slots__ = ("accepted", "ring_version", "detail")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    RING_VERSION_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    ring_version: int
    detail: str
    def __init__(self, accepted: _Optional[bool] = ..., ring_version: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    def __init__(self, key: _Optional[bytes] = ...) -> None: ...

class GetReply(_message.Message):
    __slots__ = ("found", "state", "ring_version")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RING_VERSION_FIELD_NUMBER: _ClassVar[int]
    found: bool
    state: bytes
    ring_version: int
    def __init__(self, found: _Optional[bool] = ..., state: _Optional[bytes] = ..., ring_version: _Optional[int] = ...) -> None: ...

class TopRequest(_message.Message):
    __slots__ = ("k",)
    K_FIELD_NUMBER: _ClassVar[int]
    k: int
    def __init__(self, k: _Optional[int] = ...) -> None: ...

class TopReply(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: bytes
    def __init__(self, entries: _Optional[bytes] = ...) -> None: ...

class ScanRequest(_message.Message):
    __slots__ = ("chunk", "ring_stamp")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    RING_STAMP_FIELD_NUMBER: _ClassVar[int]
    chunk: int
    ring_stamp: int
    def __init__(self, chunk: _Optional[int] = ..., ring_stamp: _Optional[int] = ...) -> None: ...

class ScanChunk(_message.Message):
    __slots__ = ("entries", "fold_epoch", "fold_marks")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    FOLD_EPOCH_FIELD_NUMBER: _ClassVar[int]
    FOLD_MARKS_FIELD_NUMBER: _ClassVar[int]
    entries: bytes
    fold_epoch: int
    fold_marks: bytes
    def __init__(self, entries: _Optional[bytes] = ..., fold_epoch: _Optional[int] = ..., fold_marks: _Optional[bytes] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeStats(_message.Message):
    __slots__ = ("node_id", "address", "ring_version", "keys", "applied", "duplicates", "queue_length", "backup_tuples", "backup_bytes", "ring_share", "checkpoints_shipped", "lost_ranges", "reducer", "pid", "uptime", "refused", "backed_up", "checkpoints_received", "under_replicated", "takeovers", "fenced", "rejoined", "handed_off", "cpu", "apply_rate", "overloaded", "tokens", "load", "busy", "queued_bytes", "sources_expired", "backups_expired", "pieces_folded", "leaving", "suspects", "moved_bytes", "checkpoint_bytes", "checkpoint_rounds", "checkpoint_seconds", "fold_epoch", "views_absorbed", "views_refused", "views_held", "retired_ranges", "retired_keys", "retired_deleted", "retired_handed_over", "state_kernel", "loop_lag_ms", "request_budget_refused", "request_budget_waited", "request_budget_wait_seconds", "request_budget_waiting", "request_budget_bytes", "request_budget_peak_bytes", "request_budget_limit_bytes")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RING_VERSION_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    BACKUP_TUPLES_FIELD_NUMBER: _ClassVar[int]
    BACKUP_BYTES_FIELD_NUMBER: _ClassVar[int]
    RING_SHARE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_SHIPPED_FIELD_NUMBER: _ClassVar[int]
    LOST_RANGES_FIELD_NUMBER: _ClassVar[int]
    REDUCER_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    UPTIME_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    BACKED_UP_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    UNDER_REPLICATED_FIELD_NUMBER: _ClassVar[int]
    TAKEOVERS_FIELD_NUMBER: _ClassVar[int]
    FENCED_FIELD_NUMBER: _ClassVar[int]
    REJOINED_FIELD_NUMBER: _ClassVar[int]
    HANDED_OFF_FIELD_NUMBER: _ClassVar[int]
    CPU_FIELD_NUMBER: _ClassVar[int]
    APPLY_RATE_FIELD_NUMBER: _ClassVar[int]
    OVERLOADED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    QUEUED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SOURCES_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    BACKUPS_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    PIECES_FOLDED_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    SUSPECTS_FIELD_NUMBER: _ClassVar[int]
    MOVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FOLD_EPOCH_FIELD_NUMBER: _ClassVar[int]
    VIEWS_ABSORBED_FIELD_NUMBER: _ClassVar[int]
    VIEWS_REFUSED_FIELD_NUMBER: _ClassVar[int]
    VIEWS_HELD_FIELD_NUMBER: _ClassVar[int]
    RETIRED_RANGES_FIELD_NUMBER: _ClassVar[int]
    RETIRED_KEYS_FIELD_NUMBER: _ClassVar[int]
    RETIRED_DELETED_FIELD_NUMBER: _ClassVar[int]
    RETIRED_HANDED_OVER_FIELD_NUMBER: _ClassVar[int]
    STATE_KERNEL_FIELD_NUMBER: _ClassVar[int]
    LOOP_LAG_MS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_BUDGET_REFUSED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_BUDGET_WAITED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_BUDGET_WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_BUDGET_WAITING_FIELD_NUMBER: _ClassVar[int]
    REQUEST_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_BUDGET_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_BUDGET_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    ring_version: int
    keys: int
    applied: int
    duplicates: int
    queue_length: int
    backup_tuples: int
    backup_bytes: int
    ring_share: float
    checkpoints_shipped: int
    lost_ranges: int
    reducer: str
    pid: int
    uptime: float
    refused: int
    backed_up: int
    checkpoints_received: int
    under_replicated: int
    takeovers: int
    fenced: bool
    rejoined: int
    handed_off: int
    cpu: float
    apply_rate: float
    overloaded: bool
    tokens: int
    load: bytes
    busy: float
    queued_bytes: int
    sources_expired: int
    backups_expired: int
    pieces_folded: int
    leaving: bool
    suspects: _containers.RepeatedScalarFieldContainer[str]
    moved_bytes: int
    checkpoint_bytes: int
    checkpoint_rounds: int
    checkpoint_seconds: float
    fold_epoch: int
    views_absorbed: int
    views_refused: int
    views_held: int
    retired_ranges: int
    retired_keys: int
    retired_deleted: int
    retired_handed_over: int
    state_kernel: str
    loop_lag_ms: float
    request_budget_refused: int
    request_budget_waited: int
    request_budget_wait_seconds: float
    request_budget_waiting: int
    request_budget_bytes: int
    request_budget_peak_bytes: int
    request_budget_limit_bytes: int
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., ring_version: _Optional[int] = ..., keys: _Optional[int] = ..., applied: _Optional[int] = ..., duplicates: _Optional[int] = ..., queue_length: _Optional[int] = ..., backup_tuples: _Optional[int] = ..., backup_bytes: _Optional[int] = ..., ring_share: _Optional[float] = ..., checkpoints_shipped: _Optional[int] = ..., lost_ranges: _Optional[int] = ..., reducer: _Optional[str] = ..., pid: _Optional[int] = ..., uptime: _Optional[float] = ..., refused: _Optional[int] = ..., backed_up: _Optional[int] = ..., checkpoints_received: _Optional[int] = ..., under_replicated: _Optional[int] = ..., takeovers: _Optional[int] = ..., fenced: _Optional[bool] = ..., rejoined: _Optional[int] = ..., handed_off: _Optional[int] = ..., cpu: _Optional[float] = ..., apply_rate: _Optional[float] = ..., overloaded: _Optional[bool] = ..., tokens: _Optional[int] = ..., load: _Optional[bytes] = ..., busy: _Optional[float] = ..., queued_bytes: _Optional[int] = ..., sources_expired: _Optional[int] = ..., backups_expired: _Optional[int] = ..., pieces_folded: _Optional[int] = ..., leaving: _Optional[bool] = ..., suspects: _Optional[_Iterable[str]] = ..., moved_bytes: _Optional[int] = ..., checkpoint_bytes: _Optional[int] = ..., checkpoint_rounds: _Optional[int] = ..., checkpoint_seconds: _Optional[float] = ..., fold_epoch: _Optional[int] = ..., views_absorbed: _Optional[int] = ..., views_refused: _Optional[int] = ..., views_held: _Optional[int] = ..., retired_ranges: _Optional[int] = ..., retired_keys: _Optional[int] = ..., retired_deleted: _Optional[int] = ..., retired_handed_over: _Optional[int] = ..., state_kernel: _Optional[str] = ..., loop_lag_ms: _Optional[float] = ..., request_budget_refused: _Optional[int] = ..., request_budget_waited: _Optional[int] = ..., request_budget_wait_seconds: _Optional[float] = ..., request_budget_waiting: _Optional[int] = ..., request_budget_bytes: _Optional[int] = ..., request_budget_peak_bytes: _Optional[int] = ..., request_budget_limit_bytes: _Optional[int] = ...) -> None: ...

class RangeRequest(_message.Message):
    __slots__ = ("token",)
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token: int
    def __init__(self, token: _Optional[int] = ...) -> None: ...

class RangeState(_message.Message):
    __slots__ = ("role", "entries")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    role: str
    entries: bytes
    def __init__(self, role: _Optional[str] = ..., entries: _Optional[bytes] = ...) -> None: ...

class ExportRangeRequest(_message.Message):
    __slots__ = ("token", "ring_stamp", "formats")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    RING_STAMP_FIELD_NUMBER: _ClassVar[int]
    FORMATS_FIELD_NUMBER: _ClassVar[int]
    token: int
    ring_stamp: int
    formats: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token: _Optional[int] = ..., ring_stamp: _Optional[int] = ..., formats: _Optional[_Iterable[int]] = ...) -> None: ...

class ExportChunk(_message.Message):
    __slots__ = ("entries", "watermarks", "chunk", "format")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    WATERMARKS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    entries: bytes
    watermarks: bytes
    chunk: int
    format: int
    def __init__(self, entries: _Optional[bytes] = ..., watermarks: _Optional[bytes] = ..., chunk: _Optional[int] = ..., format: _Optional[int] = ...) -> None: ...

class ImportChunk(_message.Message):
    __slots__ = ("ring_stamp", "token", "snapshot", "reducer", "chunk", "chunks", "entries", "watermarks", "into_state")
    RING_STAMP_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    REDUCER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    WATERMARKS_FIELD_NUMBER: _ClassVar[int]
    INTO_STATE_FIELD_NUMBER: _ClassVar[int]
    ring_stamp: int
    token: int
    snapshot: str
    reducer: str
    chunk: int
    chunks: int
    entries: bytes
    watermarks: bytes
    into_state: bool
    def __init__(self, ring_stamp: _Optional[int] = ..., token: _Optional[int] = ..., snapshot: _Optional[str] = ..., reducer: _Optional[str] = ..., chunk: _Optional[int] = ..., chunks: _Optional[int] = ..., entries: _Optional[bytes] = ..., watermarks: _Optional[bytes] = ..., into_state: _Optional[bool] = ...) -> None: ...

class ImportAck(_message.Message):
    __slots__ = ("chunks_held",)
    CHUNKS_HELD_FIELD_NUMBER: _ClassVar[int]
    chunks_held: int
    def __init__(self, chunks_held: _Optional[int] = ...) -> None: ...

class HeldRequest(_message.Message):
    __slots__ = ("token", "ring_stamp", "watermarks")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    RING_STAMP_FIELD_NUMBER: _ClassVar[int]
    WATERMARKS_FIELD_NUMBER: _ClassVar[int]
    token: int
    ring_stamp: int
    watermarks: bytes
    def __init__(self, token: _Optional[int] = ..., ring_stamp: _Optional[int] = ..., watermarks: _Optional[bytes] = ...) -> None: ...

class HeldReply(_message.Message):
    __slots__ = ("role", "holds", "lost", "ring_stamp")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    HOLDS_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    RING_STAMP_FIELD_NUMBER: _ClassVar[int]
    role: str
    holds: bool
    lost: bool
    ring_stamp: int
    def __init__(self, role: _Optional[str] = ..., holds: _Optional[bool] = ..., lost: _Optional[bool] = ..., ring_stamp: _Optional[int] = ...) -> None: ...

class RestoreChunk(_message.Message):
    __slots__ = ("ring_stamp", "token", "member", "retired", "chunk", "chunks", "entries", "watermarks")
    RING_STAMP_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    RETIRED_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    WATERMARKS_FIELD_NUMBER: _ClassVar[int]
    ring_stamp: int
    token: int
    member: str
    retired: int
    chunk: int
    chunks: int
    entries: bytes
    watermarks: bytes
    def __init__(self, ring_stamp: _Optional[int] = ..., token: _Optional[int] = ..., member: _Optional[str] = ..., retired: _Optional[int] = ..., chunk: _Optional[int] = ..., chunks: _Optional[int] = ..., entries: _Optional[bytes] = ..., watermarks: _Optional[bytes] = ...) -> None: ...
