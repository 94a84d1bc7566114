"""What a TensorFlow checkpoint's `.index` says its data shards hold, to check them on the data.

A TF checkpoint is `<prefix>.index` plus `<prefix>.data-NNNNN-of-MMMMM` shards. The index is a
leveldb-format table (TF's `table::TableBuilder`, written uncompressed) whose entry under the empty
key is a `BundleHeaderProto` and whose other entries are one `BundleEntryProto` a tensor, naming
the shard, offset and size of its bytes (tensorflow/core/protobuf/tensor_bundle.proto). A shard cut
short still has an intact index, so only these extents show it.

The table's block layout is read here (it is small and fixed: a 48-byte footer, block handles as
varints, prefix-compressed entries); the protobuf messages are decoded by the `protobuf` library,
from the few fields of TF's schema declared below. Without `protobuf` installed, nothing is read
(`extents` returns None) and the caller checks what it can without it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

TABLE_MAGIC = 0xDB4775248B80FB57
FOOTER_BYTES = 48  # two block handles padded to 40 bytes, then the magic number
BLOCK_TRAILER_BYTES = 5  # compression type (1 byte) and masked crc32c (4 bytes)
NO_COMPRESSION = 0


class BadIndex(ValueError):
    """The .index file is not a table TF could have written; the message says where."""


@dataclass(frozen=True, slots=True)
class Extent:
    tensor: str
    shard: int
    offset: int
    size: int


def extents(index: Path) -> tuple[int, list[Extent]] | None:
    """(number of shards, every tensor's extent) from the index; None without `protobuf`.
    Raises BadIndex for a table that cannot be read."""
    messages = _messages()
    if messages is None:
        return None
    header_cls, entry_cls = messages
    data = index.read_bytes()
    num_shards, out = None, []
    for key, value in _table_entries(data):
        try:
            if key == b"":
                num_shards = header_cls.FromString(value).num_shards
                continue
            entry = entry_cls.FromString(value)
        except Exception as exc:  # noqa: BLE001 (protobuf's DecodeError and its kin)
            raise BadIndex(f"entry {key[:60]!r} is not a bundle proto: {exc}") from None
        if entry.size or entry.offset:
            out.append(
                Extent(key.decode("utf-8", "replace"), entry.shard_id, entry.offset, entry.size)
            )
    if num_shards is None:
        raise BadIndex("no bundle header (the entry under the empty key)")
    return num_shards, out


def _table_entries(data: bytes):
    if len(data) < FOOTER_BYTES or struct.unpack_from("<Q", data, len(data) - 8)[0] != TABLE_MAGIC:
        raise BadIndex("no table footer (magic number) at the end")
    footer = memoryview(data)[len(data) - FOOTER_BYTES :]
    _, pos = _handle(footer, 0)  # the metaindex block: unused by TF
    (index_off, index_size), _ = _handle(footer, pos)
    for _, handle in _block(data, index_off, index_size):
        (off, size), _ = _handle(memoryview(handle), 0)
        yield from _block(data, off, size)


def _block(data: bytes, offset: int, size: int):
    """The (key, value) entries of one block, keys rebuilt from their shared prefixes."""
    end = offset + size
    if offset < 0 or end + BLOCK_TRAILER_BYTES > len(data):
        raise BadIndex(f"block at {offset} (+{size} bytes) runs past the end of the file")
    if data[end] != NO_COMPRESSION:
        raise BadIndex(f"block at {offset} is compressed (type {data[end]}); TF writes none")
    block = memoryview(data)[offset:end]
    if size < 4:
        raise BadIndex(f"block at {offset} is too short")
    restarts = struct.unpack_from("<I", block, size - 4)[0]
    limit = size - 4 - 4 * restarts
    if limit < 0:
        raise BadIndex(f"block at {offset}: {restarts} restart points do not fit")
    pos, key = 0, b""
    while pos < limit:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        length, pos = _varint(block, pos)
        if shared > len(key) or pos + unshared + length > limit:
            raise BadIndex(f"block at {offset}: entry at {pos} is malformed")
        key = key[:shared] + bytes(block[pos : pos + unshared])
        pos += unshared
        yield key, bytes(block[pos : pos + length])
        pos += length


def _handle(buf: memoryview, pos: int) -> tuple[tuple[int, int], int]:
    off, pos = _varint(buf, pos)
    size, pos = _varint(buf, pos)
    return (off, size), pos


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise BadIndex("a varint runs past its block")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


_MESSAGES: tuple | None = None


def _messages():
    """BundleHeaderProto and BundleEntryProto, with the fields read here (the others are kept
    as unknown fields by protobuf and ignored)."""
    global _MESSAGES
    if _MESSAGES is not None:
        return _MESSAGES
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError:
        return None
    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="nightshift_tf_bundle.proto", package="nightshift.tf", syntax="proto3"
    )
    header = proto.message_type.add(name="BundleHeaderProto")
    header.field.add(name="num_shards", number=1, type=f.TYPE_INT32, label=f.LABEL_OPTIONAL)
    entry = proto.message_type.add(name="BundleEntryProto")
    for name, number, kind in (
        ("shard_id", 3, f.TYPE_INT32),
        ("offset", 4, f.TYPE_INT64),
        ("size", 5, f.TYPE_INT64),
    ):
        entry.field.add(name=name, number=number, type=kind, label=f.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    _MESSAGES = tuple(
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"nightshift.tf.{n}"))
        for n in ("BundleHeaderProto", "BundleEntryProto")
    )
    return _MESSAGES
