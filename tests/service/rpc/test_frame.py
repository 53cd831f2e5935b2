"""The frame's per-item call of a stream keeps every field of the stream's call."""

from __future__ import annotations

import dataclasses

from service.rpc.frame import Call, item_call


def test_item_call_is_the_stream_call_with_the_items_own_fields() -> None:
    """Field by field, every value distinct and none a default."""
    stream = Call("EmbedStream", "m0", "r0", "Bearer t", 12.5, 7, "alice", "ipv4:10.0.0.1:5")
    item = item_call(stream, "m1", "r1", 99)
    assert item == dataclasses.replace(stream, model="m1", request_id="r1", start_ns=99)
    # A field added to Call must be carried by item_call too: this list makes it fail.
    assert [f.name for f in dataclasses.fields(Call)] == [
        "rpc", "model", "request_id", "authorization", "deadline", "start_ns", "identity",
        "peer"]
