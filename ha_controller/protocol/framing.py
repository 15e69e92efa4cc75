"""TubeMQ frames: ``token u32 | serialNo u32 | listSize u32 | listSize x (len u32 | bytes)``.

Sans-IO: bytes in, frames out; this module never imports asyncio.  The
blocks of one frame are consecutive slices of ONE byte stream (the RPC
envelope); a receiver joins them.  A sender cuts the stream into blocks of
at most ``max_block_bytes`` (8192); a decoder accepts larger blocks up to the
frame limit, since TubeMQ peers may send them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ha_controller.protocol.errors import BadToken, FrameTooLarge, ProtocolError

TOKEN = 0xFF7FF4FE
HEADER = struct.Struct(">III")
BLOCK_LEN = struct.Struct(">I")
DEFAULT_MAX_BLOCK_BYTES = 8192
DEFAULT_MAX_LIST_SIZE = 3584
DEFAULT_MAX_FRAME_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Frame:
    serial_no: int
    payload: bytes


def encode_frame(
    serial_no: int, payload: bytes, max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES
) -> bytes:
    """One frame carrying ``payload`` cut into blocks of at most ``max_block_bytes``."""
    if max_block_bytes <= 0:
        raise ValueError("max_block_bytes must be positive")
    view = memoryview(payload)
    blocks = [view[i : i + max_block_bytes] for i in range(0, len(view), max_block_bytes)]
    if not blocks:
        blocks = [view[0:0]]
    parts: list[bytes | memoryview] = [HEADER.pack(TOKEN, serial_no & 0xFFFFFFFF, len(blocks))]
    for block in blocks:
        parts.append(BLOCK_LEN.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


class FrameDecoder:
    """Incremental decoder: ``feed(data)`` returns every frame completed so far.

    Raises ``BadToken`` or ``FrameTooLarge`` (both ``ProtocolError``); after an
    error the decoder is poisoned and the connection must be closed.
    """

    def __init__(
        self,
        max_list_size: int = DEFAULT_MAX_LIST_SIZE,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self._max_list_size = max_list_size
        self._max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._pos = 0
        self._failed: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Append ``data`` (copied) and return the frames it completes."""
        if self._failed is not None:
            raise self._failed
        self._buf += data
        frames: list[Frame] = []
        try:
            while True:
                frame = self._next()
                if frame is None:
                    break
                frames.append(frame)
        except ProtocolError as exc:
            self._failed = exc
            self._buf.clear()
            self._pos = 0
            raise
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        return frames

    def _next(self) -> Frame | None:
        buf, start = self._buf, self._pos
        avail = len(buf) - start
        if avail < HEADER.size:
            # Check the token early so garbage is rejected without waiting.
            if avail >= 4 and BLOCK_LEN.unpack_from(buf, start)[0] != TOKEN:
                raise BadToken(f"bad frame token 0x{BLOCK_LEN.unpack_from(buf, start)[0]:08x}")
            return None
        token, serial_no, list_size = HEADER.unpack_from(buf, start)
        if token != TOKEN:
            raise BadToken(f"bad frame token 0x{token:08x}")
        if list_size > self._max_list_size:
            raise FrameTooLarge(f"listSize {list_size} exceeds limit {self._max_list_size}")
        pos = start + HEADER.size
        total = 0
        spans: list[tuple[int, int]] = []
        for _ in range(list_size):
            if len(buf) - pos < BLOCK_LEN.size:
                return None
            (length,) = BLOCK_LEN.unpack_from(buf, pos)
            pos += BLOCK_LEN.size
            total += length
            if total > self._max_frame_bytes:
                raise FrameTooLarge(
                    f"frame payload {total}+ bytes exceeds limit {self._max_frame_bytes}"
                )
            if len(buf) - pos < length:
                return None
            spans.append((pos, pos + length))
            pos += length
        payload = (
            b"".join(bytes(buf[a:b]) for a, b in spans)
            if len(spans) != 1
            else bytes(buf[spans[0][0] : spans[0][1]])
        )
        self._pos = pos
        return Frame(serial_no, payload)
