from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Compose(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPOSE_TOKEN_PLUS_POSITION: _ClassVar[Compose]
    COMPOSE_TOKEN_ONLY: _ClassVar[Compose]
    COMPOSE_POSITION_ONLY: _ClassVar[Compose]

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_FLOAT32: _ClassVar[DType]
    DTYPE_FLOAT16: _ClassVar[DType]
    DTYPE_BFLOAT16: _ClassVar[DType]

class Truncate(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRUNCATE_NONE: _ClassVar[Truncate]
    TRUNCATE_RIGHT: _ClassVar[Truncate]
    TRUNCATE_LEFT: _ClassVar[Truncate]
COMPOSE_TOKEN_PLUS_POSITION: Compose
COMPOSE_TOKEN_ONLY: Compose
COMPOSE_POSITION_ONLY: Compose
DTYPE_FLOAT32: DType
DTYPE_FLOAT16: DType
DTYPE_BFLOAT16: DType
TRUNCATE_NONE: Truncate
TRUNCATE_RIGHT: Truncate
TRUNCATE_LEFT: Truncate

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("shape", "dtype", "data")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: DType
    data: bytes
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[_Union[DType, str]] = ..., data: _Optional[bytes] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("queue_ns", "tokenize_ns", "compute_ns", "total_ns")
    QUEUE_NS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZE_NS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_NS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NS_FIELD_NUMBER: _ClassVar[int]
    queue_ns: int
    tokenize_ns: int
    compute_ns: int
    total_ns: int
    def __init__(self, queue_ns: _Optional[int] = ..., tokenize_ns: _Optional[int] = ..., compute_ns: _Optional[int] = ..., total_ns: _Optional[int] = ...) -> None: ...

class EmbedRequest(_message.Message):
    __slots__ = ("model", "version", "text", "token_ids", "start_position", "compose", "dtype", "truncate", "allow_special_tokens", "request_id", "output", "add_special_tokens")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    START_POSITION_FIELD_NUMBER: _ClassVar[int]
    COMPOSE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    ALLOW_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    text: str
    token_ids: TokenIds
    start_position: int
    compose: Compose
    dtype: DType
    truncate: Truncate
    allow_special_tokens: bool
    request_id: str
    output: SharedMemoryOutput
    add_special_tokens: bool
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., start_position: _Optional[int] = ..., compose: _Optional[_Union[Compose, str]] = ..., dtype: _Optional[_Union[DType, str]] = ..., truncate: _Optional[_Union[Truncate, str]] = ..., allow_special_tokens: _Optional[bool] = ..., request_id: _Optional[str] = ..., output: _Optional[_Union[SharedMemoryOutput, _Mapping]] = ..., add_special_tokens: _Optional[bool] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("embeddings", "token_ids", "start_position", "model", "version", "checkpoint_id", "truncated_tokens", "untrained_token_indices", "timing", "request_id", "output")
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    START_POSITION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    UNTRAINED_TOKEN_INDICES_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    embeddings: Tensor
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    start_position: int
    model: str
    version: int
    checkpoint_id: str
    truncated_tokens: int
    untrained_token_indices: _containers.RepeatedScalarFieldContainer[int]
    timing: Timing
    request_id: str
    output: SharedMemoryRange
    def __init__(self, embeddings: _Optional[_Union[Tensor, _Mapping]] = ..., token_ids: _Optional[_Iterable[int]] = ..., start_position: _Optional[int] = ..., model: _Optional[str] = ..., version: _Optional[int] = ..., checkpoint_id: _Optional[str] = ..., truncated_tokens: _Optional[int] = ..., untrained_token_indices: _Optional[_Iterable[int]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., request_id: _Optional[str] = ..., output: _Optional[_Union[SharedMemoryRange, _Mapping]] = ...) -> None: ...

class EmbedInput(_message.Message):
    __slots__ = ("text", "token_ids", "start_position")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    START_POSITION_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: TokenIds
    start_position: int
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., start_position: _Optional[int] = ...) -> None: ...

class EmbedBatchRequest(_message.Message):
    __slots__ = ("model", "version", "inputs", "compose", "dtype", "truncate", "allow_special_tokens", "request_id", "output", "add_special_tokens")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    COMPOSE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    ALLOW_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    inputs: _containers.RepeatedCompositeFieldContainer[EmbedInput]
    compose: Compose
    dtype: DType
    truncate: Truncate
    allow_special_tokens: bool
    request_id: str
    output: SharedMemoryOutput
    add_special_tokens: bool
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., inputs: _Optional[_Iterable[_Union[EmbedInput, _Mapping]]] = ..., compose: _Optional[_Union[Compose, str]] = ..., dtype: _Optional[_Union[DType, str]] = ..., truncate: _Optional[_Union[Truncate, str]] = ..., allow_special_tokens: _Optional[bool] = ..., request_id: _Optional[str] = ..., output: _Optional[_Union[SharedMemoryOutput, _Mapping]] = ..., add_special_tokens: _Optional[bool] = ...) -> None: ...

class BatchItem(_message.Message):
    __slots__ = ("token_ids", "start_position", "truncated_tokens", "untrained_token_indices")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    START_POSITION_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    UNTRAINED_TOKEN_INDICES_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    start_position: int
    truncated_tokens: int
    untrained_token_indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., start_position: _Optional[int] = ..., truncated_tokens: _Optional[int] = ..., untrained_token_indices: _Optional[_Iterable[int]] = ...) -> None: ...

class EmbedBatchResponse(_message.Message):
    __slots__ = ("embeddings", "offsets", "items", "model", "version", "checkpoint_id", "timing", "request_id", "output")
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    embeddings: Tensor
    offsets: _containers.RepeatedScalarFieldContainer[int]
    items: _containers.RepeatedCompositeFieldContainer[BatchItem]
    model: str
    version: int
    checkpoint_id: str
    timing: Timing
    request_id: str
    output: SharedMemoryRange
    def __init__(self, embeddings: _Optional[_Union[Tensor, _Mapping]] = ..., offsets: _Optional[_Iterable[int]] = ..., items: _Optional[_Iterable[_Union[BatchItem, _Mapping]]] = ..., model: _Optional[str] = ..., version: _Optional[int] = ..., checkpoint_id: _Optional[str] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., request_id: _Optional[str] = ..., output: _Optional[_Union[SharedMemoryRange, _Mapping]] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("model", "version", "text", "allow_special_tokens")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ALLOW_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    text: str
    allow_special_tokens: bool
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., text: _Optional[str] = ..., allow_special_tokens: _Optional[bool] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("token_ids", "tokens", "model", "version")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    tokens: _containers.RepeatedScalarFieldContainer[bytes]
    model: str
    version: int
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., tokens: _Optional[_Iterable[bytes]] = ..., model: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class DetokenizeRequest(_message.Message):
    __slots__ = ("model", "version", "token_ids")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class DetokenizeResponse(_message.Message):
    __slots__ = ("text", "model", "version")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    text: str
    model: str
    version: int
    def __init__(self, text: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ("model", "version")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class TokenizerInfo(_message.Message):
    __slots__ = ("encoding", "file", "sha256", "special_tokens", "kind")
    class SpecialTokensEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    encoding: str
    file: str
    sha256: str
    special_tokens: _containers.ScalarMap[str, int]
    kind: str
    def __init__(self, encoding: _Optional[str] = ..., file: _Optional[str] = ..., sha256: _Optional[str] = ..., special_tokens: _Optional[_Mapping[str, int]] = ..., kind: _Optional[str] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model", "version", "checkpoint_id", "vocab_size", "table_rows", "dim", "max_seq_len", "position", "storage_dtype", "device", "tokenizer", "is_default", "max_tokens_per_request", "max_text_bytes", "max_message_bytes", "provenance_json", "has_row_updates", "untrained_rows", "family", "rules", "hidden_size", "has_tokenizer")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    TABLE_ROWS_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    MAX_SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    STORAGE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    IS_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    MAX_TEXT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROVENANCE_JSON_FIELD_NUMBER: _ClassVar[int]
    HAS_ROW_UPDATES_FIELD_NUMBER: _ClassVar[int]
    UNTRAINED_ROWS_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    HAS_TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    checkpoint_id: str
    vocab_size: int
    table_rows: int
    dim: int
    max_seq_len: int
    position: str
    storage_dtype: str
    device: str
    tokenizer: TokenizerInfo
    is_default: bool
    max_tokens_per_request: int
    max_text_bytes: int
    max_message_bytes: int
    provenance_json: str
    has_row_updates: bool
    untrained_rows: int
    family: str
    rules: str
    hidden_size: int
    has_tokenizer: bool
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., checkpoint_id: _Optional[str] = ..., vocab_size: _Optional[int] = ..., table_rows: _Optional[int] = ..., dim: _Optional[int] = ..., max_seq_len: _Optional[int] = ..., position: _Optional[str] = ..., storage_dtype: _Optional[str] = ..., device: _Optional[str] = ..., tokenizer: _Optional[_Union[TokenizerInfo, _Mapping]] = ..., is_default: _Optional[bool] = ..., max_tokens_per_request: _Optional[int] = ..., max_text_bytes: _Optional[int] = ..., max_message_bytes: _Optional[int] = ..., provenance_json: _Optional[str] = ..., has_row_updates: _Optional[bool] = ..., untrained_rows: _Optional[int] = ..., family: _Optional[str] = ..., rules: _Optional[str] = ..., hidden_size: _Optional[int] = ..., has_tokenizer: _Optional[bool] = ...) -> None: ...

class SharedMemoryOutput(_message.Message):
    __slots__ = ("region", "offset", "cuda")
    REGION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    CUDA_FIELD_NUMBER: _ClassVar[int]
    region: str
    offset: int
    cuda: bool
    def __init__(self, region: _Optional[str] = ..., offset: _Optional[int] = ..., cuda: _Optional[bool] = ...) -> None: ...

class SharedMemoryRange(_message.Message):
    __slots__ = ("region", "offset", "byte_size", "cuda")
    REGION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    BYTE_SIZE_FIELD_NUMBER: _ClassVar[int]
    CUDA_FIELD_NUMBER: _ClassVar[int]
    region: str
    offset: int
    byte_size: int
    cuda: bool
    def __init__(self, region: _Optional[str] = ..., offset: _Optional[int] = ..., byte_size: _Optional[int] = ..., cuda: _Optional[bool] = ...) -> None: ...

class SharedMemoryRegion(_message.Message):
    __slots__ = ("name", "key", "offset", "byte_size")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    BYTE_SIZE_FIELD_NUMBER: _ClassVar[int]
    name: str
    key: str
    offset: int
    byte_size: int
    def __init__(self, name: _Optional[str] = ..., key: _Optional[str] = ..., offset: _Optional[int] = ..., byte_size: _Optional[int] = ...) -> None: ...

class RegisterSharedMemoryRequest(_message.Message):
    __slots__ = ("region",)
    REGION_FIELD_NUMBER: _ClassVar[int]
    region: SharedMemoryRegion
    def __init__(self, region: _Optional[_Union[SharedMemoryRegion, _Mapping]] = ...) -> None: ...

class RegisterSharedMemoryResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UnregisterSharedMemoryRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class UnregisterSharedMemoryResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSharedMemoryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSharedMemoryResponse(_message.Message):
    __slots__ = ("regions",)
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    regions: _containers.RepeatedCompositeFieldContainer[SharedMemoryRegion]
    def __init__(self, regions: _Optional[_Iterable[_Union[SharedMemoryRegion, _Mapping]]] = ...) -> None: ...

class CudaSharedMemoryRegion(_message.Message):
    __slots__ = ("name", "raw_handle", "device_id", "byte_size")
    NAME_FIELD_NUMBER: _ClassVar[int]
    RAW_HANDLE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    BYTE_SIZE_FIELD_NUMBER: _ClassVar[int]
    name: str
    raw_handle: bytes
    device_id: int
    byte_size: int
    def __init__(self, name: _Optional[str] = ..., raw_handle: _Optional[bytes] = ..., device_id: _Optional[int] = ..., byte_size: _Optional[int] = ...) -> None: ...

class RegisterCudaSharedMemoryRequest(_message.Message):
    __slots__ = ("region",)
    REGION_FIELD_NUMBER: _ClassVar[int]
    region: CudaSharedMemoryRegion
    def __init__(self, region: _Optional[_Union[CudaSharedMemoryRegion, _Mapping]] = ...) -> None: ...

class RegisterCudaSharedMemoryResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UnregisterCudaSharedMemoryRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class UnregisterCudaSharedMemoryResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCudaSharedMemoryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCudaSharedMemoryResponse(_message.Message):
    __slots__ = ("regions",)
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    regions: _containers.RepeatedCompositeFieldContainer[CudaSharedMemoryRegion]
    def __init__(self, regions: _Optional[_Iterable[_Union[CudaSharedMemoryRegion, _Mapping]]] = ...) -> None: ...
