"""Topic names and topic filters: validation and shared-subscription parsing.

Pure string helpers shared by the codec (which validates what peers send) and the
broker core (which needs the group of a shared subscription).

Rules (MQTT 3.1.1 section 4.7, MQTT 5.0 section 4.7 and 4.8.2):

- A topic name is at least one character long and contains neither ``+`` nor ``#``.
- A topic filter is at least one character long; ``#`` may only be a whole level and
  only the last one; ``+`` may only be a whole level. Levels may be empty (``a//b``).
- ``$share/<group>/<filter>`` is a shared subscription: the group is non-empty and
  contains none of ``+ # /``, and the filter is a non-empty valid topic filter.
- ``$queue/<filter>`` (the EMQX extension) is a shared subscription of the group
  ``"$queue"``; its filter is non-empty and valid.
- Length limits (65,535 bytes) and U+0000 are the codec's concern: they are properties
  of the encoded string, not of the topic syntax.

Every validation failure raises :class:`RemoteProtocolError` with
``TOPIC_NAME_INVALID`` or ``TOPIC_FILTER_INVALID``, since the strings checked here come
from a peer; the encoder converts them to :class:`LocalProtocolError`.
"""

from __future__ import annotations

from protocols.mqtt.errors import RemoteProtocolError, Violation

__all__ = [
    "QUEUE_GROUP",
    "QUEUE_PREFIX",
    "SHARE_PREFIX",
    "is_shared",
    "is_wildcard",
    "parse_shared",
    "validate_topic_filter",
    "validate_topic_name",
]

SHARE_PREFIX = "$share/"
QUEUE_PREFIX = "$queue/"
QUEUE_GROUP = "$queue"


def validate_topic_name(name: str) -> None:
    """Check a PUBLISH (or Will, or Response) topic name: non-empty, no wildcards."""
    if not name:
        raise RemoteProtocolError(Violation.TOPIC_NAME_INVALID, "empty topic name")
    if "+" in name or "#" in name:
        raise RemoteProtocolError(Violation.TOPIC_NAME_INVALID, f"wildcard in topic name {name!r}")
    if "\x00" in name:  # MQTT-4.7.3-2; front-ends other than MQTT's codec rely on this
        raise RemoteProtocolError(Violation.TOPIC_NAME_INVALID, f"U+0000 in topic name {name!r}")


def _invalid_filter(topic_filter: str, why: str) -> RemoteProtocolError:
    return RemoteProtocolError(Violation.TOPIC_FILTER_INVALID, f"{why}: {topic_filter!r}")


def parse_shared(topic_filter: str) -> tuple[str | None, str]:
    """Split a shared subscription into ``(group, real_filter)``.

    ``$share/g/f`` gives ``("g", "f")``, ``$queue/f`` gives ``("$queue", "f")`` and any
    other filter ``(None, topic_filter)``. Raises ``TOPIC_FILTER_INVALID`` when the
    ``$share/`` form lacks a group or a filter; it does not validate the filter itself
    (that is :func:`validate_topic_filter`).
    """
    if topic_filter.startswith(SHARE_PREFIX):
        group, slash, real = topic_filter[len(SHARE_PREFIX) :].partition("/")
        if not slash or not group or not real:
            raise _invalid_filter(topic_filter, "shared subscription needs group and filter")
        return group, real
    if topic_filter.startswith(QUEUE_PREFIX):
        real = topic_filter[len(QUEUE_PREFIX) :]
        if not real:
            raise _invalid_filter(topic_filter, "shared subscription needs a filter")
        return QUEUE_GROUP, real
    return None, topic_filter


def _validate_levels(topic_filter: str, real: str) -> None:
    if not real:
        raise _invalid_filter(topic_filter, "empty topic filter")
    if "\x00" in topic_filter:  # MQTT-4.7.3-2 (the broker's topic index refuses it too)
        raise _invalid_filter(topic_filter, "U+0000 in topic filter")
    if "+" not in real and "#" not in real:
        return
    levels = real.split("/")
    last = len(levels) - 1
    for index, level in enumerate(levels):
        if "#" in level:
            if level != "#" or index != last:
                raise _invalid_filter(topic_filter, "'#' must be the whole last level")
        elif "+" in level and level != "+":
            raise _invalid_filter(topic_filter, "'+' must be a whole level")


def validate_topic_filter(topic_filter: str) -> None:
    """Check a SUBSCRIBE or UNSUBSCRIBE topic filter, shared forms included."""
    group, real = parse_shared(topic_filter)
    if group is not None and group != QUEUE_GROUP and ("+" in group or "#" in group):
        raise _invalid_filter(topic_filter, "wildcard in share group")
    _validate_levels(topic_filter, real)


def is_shared(topic_filter: str) -> bool:
    """Whether the filter is a shared subscription (``$share/`` or ``$queue/``)."""
    return topic_filter.startswith(SHARE_PREFIX) or topic_filter.startswith(QUEUE_PREFIX)


def is_wildcard(topic_filter: str) -> bool:
    """Whether a (valid) topic filter contains ``+`` or ``#``."""
    return "+" in topic_filter or "#" in topic_filter
