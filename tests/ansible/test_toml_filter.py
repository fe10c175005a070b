"""The gateway role's ``to_gateway_toml`` filter: what it writes parses back to the input."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("ansible")
_PATH = Path(__file__).resolve().parents[2] / "ansible/roles/gateway/filter_plugins/gateway_toml.py"
_spec = importlib.util.spec_from_file_location("gateway_toml", _PATH)
assert _spec is not None and _spec.loader is not None
gateway_toml = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gateway_toml)
to_toml = gateway_toml.to_gateway_toml

pytestmark = pytest.mark.ansible


def test_a_gateway_configuration_round_trips() -> None:
    config: dict[str, Any] = {
        "node": {"name": "a@127.0.0.1", "data_dir": "/var/lib/gateway"},
        "listeners": {"tcp": {"default": {"bind": "0.0.0.0:1883", "max_connections": 1000}}},
        "cluster": {"enable": True, "seeds": ["b@10.0.0.2:5370"],
                    "tls": {"certfile": "/etc/gateway/cluster-pki/a.crt"}},
        "authorization": {"rules": [{"permission": "deny", "topics": ["test/nosubscribe"]}]},
        "bridges": {"mqtt": {"cloud": {"server": "up:8883", "password": 'p"w\\\x7f',
                                       "forwards": [{"local": "t/#", "remote": "x/${topic}"}],
                                       "tls": {"enable": True}}}},
        "mqtt": {"keepalive_multiplier": 1.5, "max_inflight": 32},
        "weird key": {"é": "ü\n\t"},
    }
    text = to_toml(config)
    assert tomllib.loads(text) == config
    assert "[listeners.tcp.default]" in text and "[[authorization.rules]]" in text
    assert to_toml(config) == text  # the same input renders the same bytes


def test_null_is_refused_with_its_key() -> None:
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match=r"bridges\.mqtt\.cloud\.password is null"):
        to_toml({"bridges": {"mqtt": {"cloud": {"password": None}}}})


_leaf = st.one_of(st.booleans(), st.integers(-2**63, 2**63 - 1),
                  st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
_key = st.text(min_size=1, max_size=8)
_tree = st.recursive(
    _leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(_key, inner, max_size=3)),
    max_leaves=12,
)


@given(st.dictionaries(_key, _tree, max_size=4))
def test_any_document_round_trips(doc: dict[str, Any]) -> None:
    assert tomllib.loads(to_toml(doc)) == doc
