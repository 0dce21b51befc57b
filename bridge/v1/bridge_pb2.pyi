from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FieldType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FIELD_TYPE_UNSPECIFIED: _ClassVar[FieldType]
    INT8: _ClassVar[FieldType]
    UINT8: _ClassVar[FieldType]
    INT16: _ClassVar[FieldType]
    UINT16: _ClassVar[FieldType]
    INT32: _ClassVar[FieldType]
    UINT32: _ClassVar[FieldType]
    FLOAT32: _ClassVar[FieldType]
    FLOAT64: _ClassVar[FieldType]

class StreamKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STREAM_KIND_UNSPECIFIED: _ClassVar[StreamKind]
    POINT_CLOUD: _ClassVar[StreamKind]
    TELEMETRY: _ClassVar[StreamKind]

class OverflowPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OVERFLOW_POLICY_UNSPECIFIED: _ClassVar[OverflowPolicy]
    BACKPRESSURE: _ClassVar[OverflowPolicy]
    DROP_OLDEST: _ClassVar[OverflowPolicy]

class Priority(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRIORITY_UNSPECIFIED: _ClassVar[Priority]
    PRIORITY_CONTROL: _ClassVar[Priority]
    PRIORITY_TELEMETRY: _ClassVar[Priority]
    PRIORITY_BULK: _ClassVar[Priority]

class Codec(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CODEC_NONE: _ClassVar[Codec]
    CODEC_ZSTD: _ClassVar[Codec]
    CODEC_QUANTIZED: _ClassVar[Codec]

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_CODE_UNSPECIFIED: _ClassVar[ErrorCode]
    MALFORMED: _ClassVar[ErrorCode]
    PROTOCOL_VIOLATION: _ClassVar[ErrorCode]
    UNKNOWN_STREAM: _ClassVar[ErrorCode]
    INVALID_LAYOUT: _ClassVar[ErrorCode]
    TOO_LARGE: _ClassVar[ErrorCode]
    TOO_MANY_POINTS: _ClassVar[ErrorCode]
    SEQ_REGRESSION: _ClassVar[ErrorCode]
    TOO_MANY_STREAMS: _ClassVar[ErrorCode]
    TOO_MANY_SESSIONS: _ClassVar[ErrorCode]
    UNAUTHENTICATED: _ClassVar[ErrorCode]
    SHUTTING_DOWN: _ClassVar[ErrorCode]
    CHUNK_SEQUENCE: _ClassVar[ErrorCode]
    CHUNK_ABANDONED: _ClassVar[ErrorCode]
    CODEC_ERROR: _ClassVar[ErrorCode]
FIELD_TYPE_UNSPECIFIED: FieldType
INT8: FieldType
UINT8: FieldType
INT16: FieldType
UINT16: FieldType
INT32: FieldType
UINT32: FieldType
FLOAT32: FieldType
FLOAT64: FieldType
STREAM_KIND_UNSPECIFIED: StreamKind
POINT_CLOUD: StreamKind
TELEMETRY: StreamKind
OVERFLOW_POLICY_UNSPECIFIED: OverflowPolicy
BACKPRESSURE: OverflowPolicy
DROP_OLDEST: OverflowPolicy
PRIORITY_UNSPECIFIED: Priority
PRIORITY_CONTROL: Priority
PRIORITY_TELEMETRY: Priority
PRIORITY_BULK: Priority
CODEC_NONE: Codec
CODEC_ZSTD: Codec
CODEC_QUANTIZED: Codec
ERROR_CODE_UNSPECIFIED: ErrorCode
MALFORMED: ErrorCode
PROTOCOL_VIOLATION: ErrorCode
UNKNOWN_STREAM: ErrorCode
INVALID_LAYOUT: ErrorCode
TOO_LARGE: ErrorCode
TOO_MANY_POINTS: ErrorCode
SEQ_REGRESSION: ErrorCode
TOO_MANY_STREAMS: ErrorCode
TOO_MANY_SESSIONS: ErrorCode
UNAUTHENTICATED: ErrorCode
SHUTTING_DOWN: ErrorCode
CHUNK_SEQUENCE: ErrorCode
CHUNK_ABANDONED: ErrorCode
CODEC_ERROR: ErrorCode

class PackedField(_message.Message):
    __slots__ = ("name", "offset", "type")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    offset: int
    type: FieldType
    def __init__(self, name: _Optional[str] = ..., offset: _Optional[int] = ..., type: _Optional[_Union[FieldType, str]] = ...) -> None: ...

class Pose(_message.Message):
    __slots__ = ("px", "py", "pz", "qx", "qy", "qz", "qw")
    PX_FIELD_NUMBER: _ClassVar[int]
    PY_FIELD_NUMBER: _ClassVar[int]
    PZ_FIELD_NUMBER: _ClassVar[int]
    QX_FIELD_NUMBER: _ClassVar[int]
    QY_FIELD_NUMBER: _ClassVar[int]
    QZ_FIELD_NUMBER: _ClassVar[int]
    QW_FIELD_NUMBER: _ClassVar[int]
    px: float
    py: float
    pz: float
    qx: float
    qy: float
    qz: float
    qw: float
    def __init__(self, px: _Optional[float] = ..., py: _Optional[float] = ..., pz: _Optional[float] = ..., qx: _Optional[float] = ..., qy: _Optional[float] = ..., qz: _Optional[float] = ..., qw: _Optional[float] = ...) -> None: ...

class PointCloud(_message.Message):
    __slots__ = ("point_stride", "fields", "data", "frame_id", "pose")
    POINT_STRIDE_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    FRAME_ID_FIELD_NUMBER: _ClassVar[int]
    POSE_FIELD_NUMBER: _ClassVar[int]
    point_stride: int
    fields: _containers.RepeatedCompositeFieldContainer[PackedField]
    data: bytes
    frame_id: str
    pose: Pose
    def __init__(self, point_stride: _Optional[int] = ..., fields: _Optional[_Iterable[_Union[PackedField, _Mapping]]] = ..., data: _Optional[bytes] = ..., frame_id: _Optional[str] = ..., pose: _Optional[_Union[Pose, _Mapping]] = ...) -> None: ...

class Telemetry(_message.Message):
    __slots__ = ("blob", "values")
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    BLOB_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    blob: bytes
    values: _containers.ScalarMap[str, float]
    def __init__(self, blob: _Optional[bytes] = ..., values: _Optional[_Mapping[str, float]] = ...) -> None: ...

class StreamSpec(_message.Message):
    __slots__ = ("stream_id", "kind", "voxel_size", "passthrough", "overflow", "max_points", "priority", "codec", "codec_params")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    VOXEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    PASSTHROUGH_FIELD_NUMBER: _ClassVar[int]
    OVERFLOW_FIELD_NUMBER: _ClassVar[int]
    MAX_POINTS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    CODEC_PARAMS_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    kind: StreamKind
    voxel_size: float
    passthrough: bool
    overflow: OverflowPolicy
    max_points: int
    priority: Priority
    codec: Codec
    codec_params: CodecParams
    def __init__(self, stream_id: _Optional[str] = ..., kind: _Optional[_Union[StreamKind, str]] = ..., voxel_size: _Optional[float] = ..., passthrough: _Optional[bool] = ..., overflow: _Optional[_Union[OverflowPolicy, str]] = ..., max_points: _Optional[int] = ..., priority: _Optional[_Union[Priority, str]] = ..., codec: _Optional[_Union[Codec, str]] = ..., codec_params: _Optional[_Union[CodecParams, _Mapping]] = ...) -> None: ...

class CodecParams(_message.Message):
    __slots__ = ("step", "attr_step", "level")
    STEP_FIELD_NUMBER: _ClassVar[int]
    ATTR_STEP_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    step: float
    attr_step: float
    level: int
    def __init__(self, step: _Optional[float] = ..., attr_step: _Optional[float] = ..., level: _Optional[int] = ...) -> None: ...

class ResumeState(_message.Message):
    __slots__ = ("stream_id", "delivered_seq")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_SEQ_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    delivered_seq: int
    def __init__(self, stream_id: _Optional[str] = ..., delivered_seq: _Optional[int] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("device_id", "resume_token", "streams", "resume", "auth_token")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    RESUME_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    AUTH_TOKEN_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    resume_token: str
    streams: _containers.RepeatedCompositeFieldContainer[StreamSpec]
    resume: _containers.RepeatedCompositeFieldContainer[ResumeState]
    auth_token: str
    def __init__(self, device_id: _Optional[str] = ..., resume_token: _Optional[str] = ..., streams: _Optional[_Iterable[_Union[StreamSpec, _Mapping]]] = ..., resume: _Optional[_Iterable[_Union[ResumeState, _Mapping]]] = ..., auth_token: _Optional[str] = ...) -> None: ...

class Frame(_message.Message):
    __slots__ = ("stream_id", "seq", "capture_time_ns", "point_cloud", "telemetry")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    POINT_CLOUD_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    seq: int
    capture_time_ns: int
    point_cloud: PointCloud
    telemetry: Telemetry
    def __init__(self, stream_id: _Optional[str] = ..., seq: _Optional[int] = ..., capture_time_ns: _Optional[int] = ..., point_cloud: _Optional[_Union[PointCloud, _Mapping]] = ..., telemetry: _Optional[_Union[Telemetry, _Mapping]] = ...) -> None: ...

class FrameChunk(_message.Message):
    __slots__ = ("stream_id", "seq", "total_bytes", "offset", "data")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    seq: int
    total_bytes: int
    offset: int
    data: bytes
    def __init__(self, stream_id: _Optional[str] = ..., seq: _Optional[int] = ..., total_bytes: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class FrameBatch(_message.Message):
    __slots__ = ("frames",)
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    frames: _containers.RepeatedCompositeFieldContainer[Frame]
    def __init__(self, frames: _Optional[_Iterable[_Union[Frame, _Mapping]]] = ...) -> None: ...

class EdgeMessage(_message.Message):
    __slots__ = ("hello", "frame", "batch", "chunk")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    frame: Frame
    batch: FrameBatch
    chunk: FrameChunk
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., frame: _Optional[_Union[Frame, _Mapping]] = ..., batch: _Optional[_Union[FrameBatch, _Mapping]] = ..., chunk: _Optional[_Union[FrameChunk, _Mapping]] = ...) -> None: ...

class ServerLimits(_message.Message):
    __slots__ = ("max_frame_bytes", "max_points", "max_streams_per_session", "max_batch_frames", "max_telemetry_bytes")
    MAX_FRAME_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_POINTS_FIELD_NUMBER: _ClassVar[int]
    MAX_STREAMS_PER_SESSION_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FRAMES_FIELD_NUMBER: _ClassVar[int]
    MAX_TELEMETRY_BYTES_FIELD_NUMBER: _ClassVar[int]
    max_frame_bytes: int
    max_points: int
    max_streams_per_session: int
    max_batch_frames: int
    max_telemetry_bytes: int
    def __init__(self, max_frame_bytes: _Optional[int] = ..., max_points: _Optional[int] = ..., max_streams_per_session: _Optional[int] = ..., max_batch_frames: _Optional[int] = ..., max_telemetry_bytes: _Optional[int] = ...) -> None: ...

class StreamState(_message.Message):
    __slots__ = ("stream_id", "delivered_seq", "accepted_seq")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_SEQ_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_SEQ_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    delivered_seq: int
    accepted_seq: int
    def __init__(self, stream_id: _Optional[str] = ..., delivered_seq: _Optional[int] = ..., accepted_seq: _Optional[int] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("session_id", "limits", "streams", "resumed")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    limits: ServerLimits
    streams: _containers.RepeatedCompositeFieldContainer[StreamState]
    resumed: bool
    def __init__(self, session_id: _Optional[str] = ..., limits: _Optional[_Union[ServerLimits, _Mapping]] = ..., streams: _Optional[_Iterable[_Union[StreamState, _Mapping]]] = ..., resumed: _Optional[bool] = ...) -> None: ...

class StreamAck(_message.Message):
    __slots__ = ("stream_id", "accepted_seq", "delivered_seq")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_SEQ_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_SEQ_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    accepted_seq: int
    delivered_seq: int
    def __init__(self, stream_id: _Optional[str] = ..., accepted_seq: _Optional[int] = ..., delivered_seq: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("streams",)
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    streams: _containers.RepeatedCompositeFieldContainer[StreamAck]
    def __init__(self, streams: _Optional[_Iterable[_Union[StreamAck, _Mapping]]] = ...) -> None: ...

class FlowControl(_message.Message):
    __slots__ = ("action", "stream_id", "credit_bytes")
    class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ACTION_UNSPECIFIED: _ClassVar[FlowControl.Action]
        PAUSE: _ClassVar[FlowControl.Action]
        RESUME: _ClassVar[FlowControl.Action]
    ACTION_UNSPECIFIED: FlowControl.Action
    PAUSE: FlowControl.Action
    RESUME: FlowControl.Action
    ACTION_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    CREDIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    action: FlowControl.Action
    stream_id: str
    credit_bytes: int
    def __init__(self, action: _Optional[_Union[FlowControl.Action, str]] = ..., stream_id: _Optional[str] = ..., credit_bytes: _Optional[int] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message", "stream_id", "seq", "fatal")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    FATAL_FIELD_NUMBER: _ClassVar[int]
    code: ErrorCode
    message: str
    stream_id: str
    seq: int
    fatal: bool
    def __init__(self, code: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ..., stream_id: _Optional[str] = ..., seq: _Optional[int] = ..., fatal: _Optional[bool] = ...) -> None: ...

class Drain(_message.Message):
    __slots__ = ("reconnect_after_ms", "reason")
    RECONNECT_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    reconnect_after_ms: int
    reason: str
    def __init__(self, reconnect_after_ms: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class BridgeMessage(_message.Message):
    __slots__ = ("welcome", "ack", "flow_control", "error", "drain")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    FLOW_CONTROL_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    ack: Ack
    flow_control: FlowControl
    error: Error
    drain: Drain
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., flow_control: _Optional[_Union[FlowControl, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., drain: _Optional[_Union[Drain, _Mapping]] = ...) -> None: ...

class DecimationInfo(_message.Message):
    __slots__ = ("input_points", "output_points", "voxel_size", "backend")
    INPUT_POINTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_POINTS_FIELD_NUMBER: _ClassVar[int]
    VOXEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    input_points: int
    output_points: int
    voxel_size: float
    backend: str
    def __init__(self, input_points: _Optional[int] = ..., output_points: _Optional[int] = ..., voxel_size: _Optional[float] = ..., backend: _Optional[str] = ...) -> None: ...

class Gap(_message.Message):
    __slots__ = ("first_seq", "last_seq", "count", "reason")
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    first_seq: int
    last_seq: int
    count: int
    reason: str
    def __init__(self, first_seq: _Optional[int] = ..., last_seq: _Optional[int] = ..., count: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class ProcessedFrame(_message.Message):
    __slots__ = ("stream_id", "seq", "device_id", "capture_time_ns", "ingest_time_ns", "processed_time_ns", "point_cloud", "telemetry", "decimation", "gap", "bridge_seq")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    INGEST_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    PROCESSED_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    POINT_CLOUD_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    DECIMATION_FIELD_NUMBER: _ClassVar[int]
    GAP_FIELD_NUMBER: _ClassVar[int]
    BRIDGE_SEQ_FIELD_NUMBER: _ClassVar[int]
    stream_id: str
    seq: int
    device_id: str
    capture_time_ns: int
    ingest_time_ns: int
    processed_time_ns: int
    point_cloud: PointCloud
    telemetry: Telemetry
    decimation: DecimationInfo
    gap: Gap
    bridge_seq: int
    def __init__(self, stream_id: _Optional[str] = ..., seq: _Optional[int] = ..., device_id: _Optional[str] = ..., capture_time_ns: _Optional[int] = ..., ingest_time_ns: _Optional[int] = ..., processed_time_ns: _Optional[int] = ..., point_cloud: _Optional[_Union[PointCloud, _Mapping]] = ..., telemetry: _Optional[_Union[Telemetry, _Mapping]] = ..., decimation: _Optional[_Union[DecimationInfo, _Mapping]] = ..., gap: _Optional[_Union[Gap, _Mapping]] = ..., bridge_seq: _Optional[int] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("stream_ids", "from_bridge_seq", "queue_frames")
    STREAM_IDS_FIELD_NUMBER: _ClassVar[int]
    FROM_BRIDGE_SEQ_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FRAMES_FIELD_NUMBER: _ClassVar[int]
    stream_ids: _containers.RepeatedScalarFieldContainer[str]
    from_bridge_seq: int
    queue_frames: int
    def __init__(self, stream_ids: _Optional[_Iterable[str]] = ..., from_bridge_seq: _Optional[int] = ..., queue_frames: _Optional[int] = ...) -> None: ...

class StreamWatermark(_message.Message):
    __slots__ = ("device_id", "stream_id", "seq")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    stream_id: str
    seq: int
    def __init__(self, device_id: _Optional[str] = ..., stream_id: _Optional[str] = ..., seq: _Optional[int] = ...) -> None: ...

class SinkAck(_message.Message):
    __slots__ = ("bridge_seq", "watermarks")
    BRIDGE_SEQ_FIELD_NUMBER: _ClassVar[int]
    WATERMARKS_FIELD_NUMBER: _ClassVar[int]
    bridge_seq: int
    watermarks: _containers.RepeatedCompositeFieldContainer[StreamWatermark]
    def __init__(self, bridge_seq: _Optional[int] = ..., watermarks: _Optional[_Iterable[_Union[StreamWatermark, _Mapping]]] = ...) -> None: ...

class ProcessedFrameBatch(_message.Message):
    __slots__ = ("frames",)
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    frames: _containers.RepeatedCompositeFieldContainer[ProcessedFrame]
    def __init__(self, frames: _Optional[_Iterable[_Union[ProcessedFrame, _Mapping]]] = ...) -> None: ...
