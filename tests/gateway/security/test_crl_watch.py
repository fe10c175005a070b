"""CRL files read whole or not at all (:func:`gateway.net.tls.load_crls`), and the file
watch of :mod:`gateway.security.crlwatch` (a real event loop, real files)."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.net.tls import TlsError, load_crls
from gateway.security.ca_revoke import make_crl, revoke
from gateway.security.crlwatch import FileWatch
from gateway.security.pki import init_ca, issue

pytestmark = pytest.mark.security


@pytest.fixture(scope="module")
def two_crls(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    """Two PEM CRLs of one CA: one empty, one revoking dev1 (bytes of each file)."""
    d = tmp_path_factory.mktemp("ca")
    init_ca(d)
    issue(d, "dev1", server=False, client=True)
    make_crl(d)
    first = (d / "crl.pem").read_bytes()
    revoke(d, "dev1", "keyCompromise")
    make_crl(d)
    return first, (d / "crl.pem").read_bytes()


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_crl_file_cut_anywhere_is_refused_or_whole(two_crls, tmp_path: Path, data) -> None:
    """Any prefix of a file of two PEM CRLs (a writer caught at any byte): either a
    TlsError, or CRLs that are exactly the complete ones before the cut; never fewer
    CRLs passed off as the file."""
    whole = two_crls[0] + two_crls[1]
    cut = data.draw(st.integers(0, len(whole)))
    path = tmp_path / "crl.pem"
    path.write_bytes(whole[:cut])
    try:
        got = load_crls("crlfile", [path])
    except TlsError as exc:
        assert exc.key == "crlfile"
        return
    end = b"-----END X509 CRL-----"
    complete = whole[:cut].count(end)
    assert len(got) == complete >= 1
    # what follows the last END is blank: nothing of a further CRL was dropped
    assert not whole[:cut].rsplit(end, 1)[1].strip()


def test_a_pem_file_ending_inside_a_crl_is_refused(two_crls, tmp_path: Path) -> None:
    path = tmp_path / "crl.pem"
    path.write_bytes(two_crls[0] + two_crls[1][:40])
    with pytest.raises(TlsError, match="ends inside a CRL"):
        load_crls("crlfile", [path])
    path.write_bytes(two_crls[0] + two_crls[1])
    assert len(load_crls("crlfile", [path])) == 2


def test_file_watch_sees_a_rewrite_a_rename_and_a_new_file(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, "gateway.security.crlwatch")
    a, b = tmp_path / "a.pem", tmp_path / "b.pem"
    a.write_bytes(b"one")

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        seen: list[str] = []
        changed = asyncio.Event()

        def on(name: str) -> None:
            seen.append(name)
            changed.set()

        watch = FileWatch(loop, 0.05)
        watch.add("A", [a], lambda: on("A"))
        watch.add("B", [b], lambda: on("B"))
        assert watch.check() == 0  # nothing changed since add
        def rename() -> None:  # replaced by a rename (a new inode)
            (tmp_path / "t").write_bytes(b"x")
            os.replace(tmp_path / "t", a)

        for step in (lambda: a.write_bytes(b"one, longer"),  # rewritten in place
                     rename,
                     lambda: b.write_bytes(b"new")):  # appeared
            changed.clear()
            step()
            await asyncio.wait_for(changed.wait(), 10)
        watch.close()
        return seen

    assert asyncio.run(main()) == ["A", "A", "B"]
    assert caplog.text.count("CRL file changed") == 3


def test_file_watch_survives_a_failing_callback(tmp_path: Path, caplog) -> None:
    path = tmp_path / "crl.pem"
    path.write_bytes(b"x")
    calls: list[int] = []

    def boom() -> None:
        calls.append(1)
        raise RuntimeError("boom")

    async def main() -> None:
        watch = FileWatch(asyncio.get_running_loop(), 3600)
        watch.add("X", [path], boom)
        path.write_bytes(b"xy")
        assert watch.check() == 1
        path.write_bytes(b"xyz")
        assert watch.check() == 1
        watch.close()

    asyncio.run(main())
    assert calls == [1, 1]
    assert "reloading the changed CRL file failed" in caplog.text
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ValueError):
            FileWatch(loop, 0)
    finally:
        loop.close()
