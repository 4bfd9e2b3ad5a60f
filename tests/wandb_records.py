"""Read the records of an offline wandb run file (``run-*.wandb``) without the network (test helper).

The file is LevelDB's log format after a 7-byte W&B header: 32 KiB blocks of records with a 7-byte header (CRC32,
little-endian length, type FULL/FIRST/MIDDLE/LAST); each payload is a serialized ``wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import struct

BLOCK = 32768
HEADER = 7


def iter_payloads(path):
    data = open(path, "rb").read()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a wandb run file")
    pos, chunks = HEADER, []
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        payload = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == 0 and length == 0:
            pos += BLOCK - pos % BLOCK if pos % BLOCK else 0
            continue
        if kind == 1:
            yield payload
        elif kind == 2:
            chunks = [payload]
        elif kind == 3:
            chunks.append(payload)
        elif kind == 4:
            chunks.append(payload)
            yield b"".join(chunks)
            chunks = []


def history_keys_and_metrics(path) -> tuple[set[str], set[str]]:
    """Keys logged to the run's history and the metric names/globs declared with ``define_metric``."""
    from wandb.proto import wandb_internal_pb2

    keys, metrics = set(), set()
    for payload in iter_payloads(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            keys.update(item.key or "/".join(item.nested_key) for item in record.history.item)
        elif kind == "metric":
            metrics.add(record.metric.name or record.metric.glob_name)
    return keys, metrics
