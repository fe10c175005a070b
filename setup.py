"""The wheel's build. Everything is in pyproject.toml but the compiled hot path.

With ``EDGE_GATEWAY_COMPILE=1`` the modules in :data:`HOT_PATH` are compiled to C
extensions with mypyc (shipped with mypy, a build requirement): the same source, typed
throughout, about 1.3-1.5x less CPU per message (docs/performance.md). Without it (the
default: editable installs, the test suite) the wheel is pure Python. A compiled module
is an ``.so`` beside its ``.py``; Python imports the ``.so`` when both are there.

``scripts/wheelhouse`` builds the compiled wheel for the image and Ansible on the
build host's arch; ``scripts/compile`` builds the extensions in place in a source tree.
"""

from __future__ import annotations

import os

from setuptools import setup

#: Compiled when EDGE_GATEWAY_COMPILE=1: one connection's input from the socket to the
#: subscribers' sockets, and the store's journal on that path (a persistent session's
#: queue records, the group commit; the log frames it writes are pickles of plain
#: tuples, the same from either build). Not here: protocols/mqtt/packets.py (its frozen dataclasses
#: would not unpickle from a journal written by the pure build), protocols/context.py
#: (the same, and shared by every front-end), protocols/empties.py (subclasses of
#: builtins, which mypyc cannot compile), protocols/channel_base.py (MQTT-SN's and
#: CoAP's channels subclass it, and an interpreted class cannot subclass a compiled one:
#: so every subclass of a class here is here too, like gateway/net/datagram.py's peer).
HOT_PATH = [
    "protocols/effects.py",
    "protocols/mqtt/channel.py",
    "protocols/mqtt/connection.py",
    "protocols/mqtt/decoder.py",
    "protocols/mqtt/encoder.py",
    "protocols/mqtt/properties.py",
    "protocols/mqtt/topics.py",
    "protocols/mqtt/wire.py",
    "gateway/core/broker.py",
    "gateway/core/node.py",
    "gateway/core/session.py",
    "gateway/core/topic_index.py",
    "gateway/net/datagram.py",
    "gateway/net/lean.py",
    "gateway/net/shell.py",
    "gateway/net/stream.py",
    "gateway/store/journal_log.py",
    "gateway/store/sessions.py",
    "gateway/store/writer.py",
]


def ext_modules() -> list[object]:
    flag = os.environ.get("EDGE_GATEWAY_COMPILE", "0")
    if flag not in ("0", "1"):
        raise SystemExit(f"EDGE_GATEWAY_COMPILE must be 0 or 1, got {flag!r}")
    if flag == "0":
        return []
    _target_suffix()  # before mypyc is imported
    from mypyc.build import mypycify

    # the build's own mypy configuration: pyproject.toml's names a plugin and files that
    # a wheel build does not have
    return list(mypycify(["--config-file", "mypyc.ini", *HOT_PATH], opt_level="3"))


def _target_suffix() -> None:
    """When cross-compiling (image/edge_image/cross.py: the target's sysconfig), the
    target's extension suffix first in ``EXTENSION_SUFFIXES``: mypyc takes the first one
    when it is imported, and bakes it into each compiled module's ``__file__`` and
    ``__spec__.origin`` (the file names setuptools writes are right either way)."""
    import importlib.machinery
    import sysconfig

    target = sysconfig.get_config_var("EXT_SUFFIX")
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    if target and target != suffixes[0]:
        suffixes.insert(0, target)


setup(ext_modules=ext_modules())
