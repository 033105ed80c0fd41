"""Scalars out of TensorBoard event files, read without TensorFlow or TensorBoard.

An event file is a sequence of TFRecords: an 8-byte little-endian length, the masked CRC-32C of
those 8 bytes, the data, and the masked CRC-32C of the data. The data is an ``Event`` protocol
buffer: ``wall_time`` (field 1, double), ``step`` (2, int64) and a ``Summary`` (5) of ``Value``s,
each with a ``tag`` (1) and either ``simple_value`` (2, float: what torch's SummaryWriter and
Lightning write) or a ``tensor`` (8: TensorBoard's newer scalar form). Only what a scalar needs is
decoded. A record still being written is left for the next read.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from .observations import plausible_time


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE: list[int] = []


def crc32c(data: bytes) -> int:
    if not _TABLE:
        _TABLE.extend(_crc32c_table())
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class CorruptRecord(ValueError):
    """A record whose checksum does not match: the file is damaged from here on."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 70:
            raise ValueError("varint too long")


def fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of a protocol buffer message: an int for varints, bytes
    for length-delimited fields, the raw 8 or 4 bytes for fixed-size ones."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > len(buf):
            raise ValueError("truncated field")
        yield number, wire, value


@dataclass(frozen=True)
class Scalar:
    tag: str
    step: int
    wall_time: float
    value: float


def _tensor_value(buf: bytes) -> Optional[float]:
    """The single number of a scalar TensorProto (dtype float or double)."""
    dtype = 1
    content = b""
    for number, wire, value in fields(buf):
        if number == 1 and wire == 0:
            dtype = int(value)
        elif number == 4 and wire == 2:
            content = bytes(value)
        elif number == 5:   # float_val: packed, or one fixed32
            raw = bytes(value)
            return struct.unpack("<f", raw[:4])[0] if len(raw) >= 4 else None
        elif number == 6:   # double_val
            raw = bytes(value)
            return struct.unpack("<d", raw[:8])[0] if len(raw) >= 8 else None
    if content:
        if dtype == 2 and len(content) >= 8:
            return struct.unpack("<d", content[:8])[0]
        if len(content) >= 4:
            return struct.unpack("<f", content[:4])[0]
    return None


def scalars(event: bytes) -> list[Scalar]:
    """The scalars of one Event message."""
    wall_time, step, summaries = 0.0, 0, []
    for number, wire, value in fields(event):
        if number == 1 and wire == 1:
            wall_time = struct.unpack("<d", value)[0]
        elif number == 2 and wire == 0:
            step = int(value)
            if step >= 1 << 63:
                step -= 1 << 64
        elif number == 5 and wire == 2:
            summaries.append(bytes(value))
    out = []
    for summary in summaries:
        for number, wire, value in fields(summary):
            if number != 1 or wire != 2:
                continue
            tag, number_value = "", None
            for vnum, vwire, vvalue in fields(bytes(value)):
                if vnum == 1 and vwire == 2:
                    tag = bytes(vvalue).decode("utf-8", "replace")
                elif vnum == 2 and vwire == 5:
                    number_value = struct.unpack("<f", vvalue)[0]
                elif vnum == 8 and vwire == 2:
                    number_value = _tensor_value(bytes(vvalue))
            if tag and number_value is not None:
                out.append(Scalar(tag, step, wall_time, float(number_value)))
    return out


CHUNK = 16 << 20   # read of a growing file per call: memory stays bounded, the rest comes next


def read_from(path: Path, offset: int) -> bytes:
    """What a growing regular file holds from `offset` on, at most CHUNK bytes (nothing when it
    cannot be read now, or is not a regular file: a FIFO or device is never waited on)."""
    from ..plumbing import fsio
    from ..plumbing.errors import JobgenError
    try:
        return fsio.read_bytes(path, CHUNK, offset=offset, partial=True)
    except (OSError, JobgenError):
        return b""


class EventFile:
    """Reads an event file incrementally: each `read` returns the scalars of the records
    completed since the last one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.damaged: Optional[str] = None

    def read(self) -> list[Scalar]:
        if self.damaged:
            return []
        data = read_from(self.path, self.offset)
        out: list[Scalar] = []
        pos = 0
        while len(data) - pos >= 12:
            header = data[pos:pos + 8]
            (length,) = struct.unpack("<Q", header)
            (header_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
            if masked_crc(header) != header_crc:
                self.damaged = f"{self.path}: bad record header at byte {self.offset + pos}"
                break
            end = pos + 12 + length + 4
            if end > len(data):
                break   # still being written
            body = data[pos + 12:pos + 12 + length]
            (body_crc,) = struct.unpack("<I", data[end - 4:end])
            if masked_crc(body) != body_crc:
                self.damaged = f"{self.path}: bad record at byte {self.offset + pos}"
                break
            try:
                out.extend(s for s in scalars(body) if plausible_time(s.wall_time))
            except (ValueError, struct.error):
                pass    # an event of a kind this reader does not decode
            pos = end
        self.offset += pos
        return out
