"""Where a download may be redirected, decided in process: internal addresses (IPv4-mapped IPv6 included) are refused
unless the operator allows them, a host that does not resolve is refused with a one-line reason.
./scripts/mutants runs these for edgecore/delivery/redirects.py."""

from __future__ import annotations

import pytest

from edgecore.delivery.redirects import RedirectPolicy, RedirectRefused, _internal, origin_of


@pytest.mark.parametrize(("address", "internal"), [
    ("10.0.0.1", True), ("127.0.0.1", True), ("224.0.0.1", True), ("8.8.8.8", False),
    ("::ffff:10.0.0.1", True), ("::ffff:8.8.8.8", False), ("::1", True), ("fe80::1%eth0", True),
    ("2001:4860:4860::8888", False),
])
def test_internal_addresses_are_told_from_global_ones(address: str, internal: bool) -> None:
    assert _internal(address) is internal


def test_a_policy_refuses_internal_addresses_unless_told_otherwise() -> None:
    signed = frozenset({origin_of("https://cdn.example.com/m")})
    closed = RedirectPolicy(signed, ("localhost",))
    assert closed.private is False
    with pytest.raises(RedirectRefused, match=r"resolves to the internal address .* is off"):
        closed.check("http://localhost:8080/m")
    assert RedirectPolicy(signed, ("localhost",), private=True).check("http://localhost:8080/m") in ("127.0.0.1", "::1")
    assert closed.check("https://cdn.example.com/m") is None  # the signed origin itself: its host, as signed


def test_a_host_that_does_not_resolve_is_refused() -> None:
    policy = RedirectPolicy(frozenset(), ("nothing.invalid",))
    with pytest.raises(RedirectRefused) as caught:
        policy.check("http://nothing.invalid/m")
    assert str(caught.value).startswith("to nothing.invalid, which does not resolve (")
