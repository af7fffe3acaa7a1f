"""Reading W&B's offline run files (run-*.wandb) back, to test what the export wrote: LevelDB-log framing
(32 KiB blocks, 7-byte chunk headers) of wandb's own protobuf Records, after a 7-byte ':W&B' file header."""

from __future__ import annotations

import json
from pathlib import Path

_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, chunks, buf = 7, [], b""
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == _FULL:
            chunks.append(chunk)
        elif kind == _FIRST:
            buf = chunk
        elif kind == _MIDDLE:
            buf += chunk
        elif kind == _LAST:
            chunks.append(buf + chunk)
        else:
            break
    out = []
    for c in chunks:
        r = pb.Record()
        r.ParseFromString(c)
        out.append(r)
    return out


def run(path: Path) -> dict:
    """A run file as plain data: name, group, job type, tags, config, history rows, final summary."""
    out = {"config": {}, "history": [], "summary": {}}

    def key(item):
        return item.key or "/".join(item.nested_key)

    for r in records(path):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            out.update(name=r.run.display_name, group=r.run.run_group, job_type=r.run.job_type, tags=list(r.run.tags))
            out["config"].update({i.key: json.loads(i.value_json) for i in r.run.config.update})
        elif kind == "config":
            out["config"].update({i.key: json.loads(i.value_json) for i in r.config.update})
        elif kind == "history":
            out["history"].append({key(i): json.loads(i.value_json) for i in r.history.item})
        elif kind == "summary":
            out["summary"].update({key(i): json.loads(i.value_json) for i in r.summary.update})
    return out
