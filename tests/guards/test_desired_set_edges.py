"""A desired set's sequence number at its lower edge: 1 is the first a controller sends, 0 is refused.
./scripts/mutants runs this for edgecore/protocol/messages.py."""

from __future__ import annotations

import pytest

from edgecore.errors import ProtocolError
from edgecore.protocol.messages import DesiredSet, read_desired
from tests.edgecore.test_desired_set import payload


def test_a_desired_set_starts_at_sequence_1() -> None:
    first = read_desired(payload(seq=1))
    assert isinstance(first, DesiredSet) and first.seq == 1
    with pytest.raises(ProtocolError, match="seq"):
        read_desired(payload(seq=0))
