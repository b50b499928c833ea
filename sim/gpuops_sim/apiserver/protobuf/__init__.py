"""Kubernetes' protobuf encoding of built-in kinds (`application/vnd.kubernetes.protobuf`), driven by a
table derived from the published IDL; see table.py for where the table comes from."""

from .codec import DecodeError, decode_object, encode_object, encode_watch_frame
from .special import EncodeError

CONTENT_TYPE = "application/vnd.kubernetes.protobuf"
WATCH_CONTENT_TYPE = "application/vnd.kubernetes.protobuf;stream=watch"

__all__ = [
    "CONTENT_TYPE",
    "WATCH_CONTENT_TYPE",
    "DecodeError",
    "EncodeError",
    "decode_object",
    "encode_object",
    "encode_watch_frame",
]
