"""What a secure transport fixes about a peer: the client id and username it must use.

A DTLS listener may take a peer's client id and/or username from its handshake (the
certificate's CN, DN or SAN, or the PSK identity; ``gateway.net.dtls`` resolves which).
The channel then checks what the peer names in its requests against this
:class:`BoundIdentity` with :meth:`BoundIdentity.check`:

- a field the identity fixes and the request leaves out is filled in from the identity;
- a field the request names differently is a mismatch (CoAP answers 4.03 Forbidden);
- a field a rule asks for but the handshake did not give (a client certificate without a
  CN, say) is ``missing`` (CoAP answers 4.01 Unauthorized), whatever the request names.

Fields the identity does not fix are the request's own. No I/O, no gateway imports.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class IdentityRefused:
    """Why a request's client id/username is refused; ``missing`` means the handshake
    lacks what the listener requires (unauthorized) rather than a mismatch (forbidden)."""

    reason: str
    missing: bool


@dataclass(frozen=True, slots=True)
class BoundIdentity:
    client_id: str | None = None  # the only client id this peer may use
    username: str | None = None  # the only username this peer may use
    missing: str | None = None  # a rule applies but the handshake lacks its field: why
    source: str = "DTLS identity"  # for messages: "certificate CN", "PSK identity", ...

    def check(
        self, client_id: str | None, username: str | None
    ) -> tuple[str | None, str | None] | IdentityRefused:
        """The client id and username to use, or why the request is refused."""
        if self.missing is not None:
            return IdentityRefused(self.missing, missing=True)
        if self.client_id is not None:
            if client_id and client_id != self.client_id:
                return IdentityRefused(
                    f"client id {client_id!r} does not match the {self.source} "
                    f"{self.client_id!r}",
                    missing=False,
                )
            client_id = self.client_id
        if self.username is not None:
            if username and username != self.username:
                return IdentityRefused(
                    f"username {username!r} does not match the {self.source} "
                    f"{self.username!r}",
                    missing=False,
                )
            username = self.username
        return client_id, username
