"""The embedded broker's transport writes each message atomically (portal/broker.py)."""

from __future__ import annotations

import os

from kombu import Connection

from portal.broker import Transport


def test_put_leaves_no_partial_file_and_round_trips(tmp_path):
    options = {
        "data_folder_in": str(tmp_path),
        "data_folder_out": str(tmp_path),
        "control_folder": str(tmp_path / "control"),
    }
    with Connection("filesystem://", transport=Transport, transport_options=options) as conn:
        queue = conn.SimpleQueue("q")
        for i in range(50):
            queue.put({"n": i})
        assert not [n for n in os.listdir(tmp_path) if n.endswith(".part")]
        # the filesystem transport orders by millisecond then uuid: complete, not strictly FIFO
        assert sorted(queue.get(timeout=1).payload["n"] for _ in range(50)) == list(range(50))
        queue.close()


def test_partial_file_is_invisible_to_consumers(tmp_path):
    options = {
        "data_folder_in": str(tmp_path),
        "data_folder_out": str(tmp_path),
        "control_folder": str(tmp_path / "control"),
    }
    (tmp_path / "1_x.q.msg.part").write_bytes(b"")  # a writer in the middle of its put
    with Connection("filesystem://", transport=Transport, transport_options=options) as conn:
        channel = conn.default_channel
        try:
            channel._get("q")
            raise AssertionError("an unfinished message must not be delivered")
        except Exception as exc:  # kombu raises Empty when nothing complete is queued
            assert type(exc).__name__ == "Empty"
