"""The fault suite's port picking: a server restarted mid-scenario must find its port free."""

from __future__ import annotations

import pytest

from tests.faults.pg import _ephemeral_range_start, _port_free, free_port

pytestmark = pytest.mark.faults


def test_free_ports_lie_below_the_ephemeral_range_and_are_free() -> None:
    """A port the kernel may give an outgoing connection while the broker or the cluster is
    stopped would make their restart fail (a Kafka fault scenario did, once)."""
    below = _ephemeral_range_start()
    for _ in range(20):
        port = free_port(span=2)
        assert port + 1 < below
        assert _port_free(port) and _port_free(port + 1)
