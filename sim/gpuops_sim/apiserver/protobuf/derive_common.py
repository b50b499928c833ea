"""What the modules deriving and checking the protobuf wire table share: the error they raise on sources they
cannot read with certainty, and the vocabulary of the table's rows."""

from __future__ import annotations

# a row's type: one of these scalars (those the codec has a wire rule for) or a message's full name
SCALARS = frozenset({"string", "bool", "int32", "int64", "bytes", "double"})
# a row's label: optional, repeated or map
LABELS = frozenset({"o", "r", "m"})
# a row's JSON flags, in this order: pointer, omitempty, omitzero, inline, struct held by value
FLAG_ORDER = "peziv"
# the wire word a gogo protobuf struct tag gives each scalar; messages are bytes
GOGO_WIRE = {"string": "bytes", "bytes": "bytes", "bool": "varint", "int32": "varint", "int64": "varint",
             "double": "fixed64"}


class DeriveError(Exception):
    """A source file did not look as the parsers expect, or the IDL and the Go tags disagree: never guess."""
