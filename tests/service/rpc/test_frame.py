"""The frame's per-item call of a stream keeps every field of the stream's call."""

from __future__ import annotations

from service.rpc.frame import Call, item_call


class _Context:
    def peer(self) -> str:
        return "ipv4:10.0.0.9:7"


def test_item_call_is_the_stream_call_with_the_items_own_fields() -> None:
    """Slot by slot, every value distinct and none a default."""
    stream = Call("EmbedStream", "m0", "r0", "Bearer t", 12.5, 7, "alice", "ipv4:10.0.0.1:5",
                  _Context())
    item = item_call(stream, "m1", "r1", 99)
    changed = {"model": "m1", "request_id": "r1", "start_ns": 99}
    # A slot added to Call must be carried by item_call too: every slot is compared.
    for name in Call.__slots__:
        assert getattr(item, name) == changed.get(name, getattr(stream, name)), name
    assert sorted(Call.__slots__) == [
        "_context", "_peer", "authorization", "deadline", "identity", "model", "request_id",
        "rpc", "start_ns"]


def test_the_peer_is_read_from_the_transport_once_asked_for() -> None:
    call = Call("Embed", context=_Context())
    assert call._peer == ""
    assert call.peer == "ipv4:10.0.0.9:7"
    assert Call("Embed").peer == ""  # no transport to ask (REST, tests)
