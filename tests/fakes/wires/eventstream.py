"""The AWS event-stream binary framing (``application/vnd.amazon.eventstream``), written from its public
specification (the "Event Stream Encoding" of the AWS SDKs' reference and the transcribe/kinesis/bedrock
streaming docs), standard library only. Each message is:

- a 12-byte prelude: total length (uint32, big-endian: the whole message with its prelude and both CRCs),
  headers length (uint32), and the CRC32 of those 8 bytes (uint32);
- headers, each: name length (uint8), name (UTF-8), value type (uint8), value; the only type used here is
  7, a string: length (uint16) then UTF-8 bytes;
- the payload (a JSON object here);
- the message CRC32 (uint32) of everything before it, prelude included.

CRC32 is the IEEE polynomial of ``zlib.crc32``. An event carries ``:message-type: event``,
``:event-type`` (the stream's member name: ``messageStart``, ``contentBlockDelta``, ...) and
``:content-type``; an exception ``:message-type: exception`` and ``:exception-type`` (a member name too:
``modelStreamErrorException``, ``throttlingException``, ...), which the AWS SDKs raise. tests/fakes/
test_wire_bedrock.py checks that botocore's own ``EventStreamBuffer`` decodes these messages.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping
from typing import Any, ClassVar

from .base import Frame, Framing

EXCEPTION = "exception:"
"""A frame whose name starts so is an exception message (``("exception:throttlingException", {...})``)."""

_STRING = 7


def encode_headers(headers: Mapping[str, str]) -> bytes:
    out = bytearray()
    for name, value in headers.items():
        n, v = name.encode(), value.encode()
        out += struct.pack(">B", len(n)) + n + struct.pack(">BH", _STRING, len(v)) + v
    return bytes(out)


def encode_message(headers: Mapping[str, str], payload: bytes) -> bytes:
    """One event-stream message: prelude, prelude CRC, headers, payload, message CRC."""
    head = encode_headers(headers)
    total = 12 + len(head) + len(payload) + 4
    prelude = struct.pack(">II", total, len(head))
    body = prelude + struct.pack(">I", zlib.crc32(prelude)) + head + payload
    return body + struct.pack(">I", zlib.crc32(body))


class EventStreamFraming(Framing):
    content_type: ClassVar[str] = "application/vnd.amazon.eventstream"

    def encode(self, frame: Frame) -> bytes:
        name, data = frame
        payload: Any = data if isinstance(data, (bytes, str)) else json.dumps(data, separators=(",", ":"))
        payload = payload.encode() if isinstance(payload, str) else payload
        name = name or ""
        if name.startswith(EXCEPTION):
            headers = {":message-type": "exception", ":exception-type": name[len(EXCEPTION):],
                       ":content-type": "application/json"}
        else:
            headers = {":message-type": "event", ":event-type": name, ":content-type": "application/json"}
        return encode_message(headers, payload)


EVENTSTREAM = EventStreamFraming()
