"""What Python's ``ssl`` module does not expose, on the same OpenSSL it links: verify
depth and server-side OCSP stapling, through ctypes on the ``SSL_CTX`` behind an
``ssl.SSLContext``; and the peer's verified certificate chain of a connection
(:func:`verified_chain`; Python 3.13 has ``SSLObject.get_verified_chain``, 3.11 not).

The ``SSL_CTX *`` is the first field after ``PyObject_HEAD`` of CPython's ``PySSLContext``
(``Modules/_ssl.c``, unchanged since 3.4); the functions come from the ``libssl`` that
``_ssl`` itself loaded (same soname, so ``dlopen`` returns that very library).

Invariants:

- :func:`available` is False (and every setter a no-op returning False) when the
  interpreter is not CPython, the library cannot be found, or its version differs from
  ``ssl.OPENSSL_VERSION_NUMBER``: we never call into a different OpenSSL than the one
  that owns the context.
- The stapled response is handed to OpenSSL in a buffer from ``CRYPTO_malloc``, which
  OpenSSL frees with the connection (``SSL_set_tlsext_status_ocsp_resp`` takes
  ownership). The ctypes callback objects live as long as the :class:`Stapler`.
- :func:`verified_chain` reads the ``SSL *`` of CPython's ``PySSLSocket`` (the field after
  the ``Socket`` weak reference) only once the field after it is seen to hold that very
  object's ``SSLContext``; otherwise (another layout) it returns None, never guesses.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform
import ssl
import sys

__all__ = ["Stapler", "available", "set_verify_depth", "verified_chain"]

log = logging.getLogger("gateway.net.tls")

_SSL_CTRL_SET_TLSEXT_STATUS_REQ_CB = 63
_SSL_CTRL_SET_TLSEXT_STATUS_REQ_OCSP_RESP = 71  # (65 is ..._STATUS_REQ_TYPE)
_SSL_TLSEXT_ERR_OK = 0
_SSL_TLSEXT_ERR_NOACK = 3

_STATUS_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_GENERIC_CB = ctypes.CFUNCTYPE(None)


def _load() -> ctypes.CDLL | None:
    if platform.python_implementation() != "CPython" or not sys.platform.startswith("linux"):
        return None
    try:
        import _ssl

        names = [_ssl.__file__] if getattr(_ssl, "__file__", None) else []
    except ImportError:  # pragma: no cover
        return None
    names += ["libssl.so.3", ctypes.util.find_library("ssl") or ""]
    for name in names:
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            lib.OpenSSL_version_num.restype = ctypes.c_ulong
            if lib.OpenSSL_version_num() != ssl.OPENSSL_VERSION_NUMBER:
                continue
        except (OSError, AttributeError):
            continue
        lib.SSL_CTX_set_verify_depth.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.SSL_CTX_set_verify_depth.restype = None
        lib.SSL_CTX_callback_ctrl.argtypes = [ctypes.c_void_p, ctypes.c_int, _GENERIC_CB]
        lib.SSL_CTX_callback_ctrl.restype = ctypes.c_long
        lib.SSL_ctrl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_void_p]
        lib.SSL_ctrl.restype = ctypes.c_long
        lib.CRYPTO_malloc.argtypes = [ctypes.c_size_t, ctypes.c_char_p, ctypes.c_int]
        lib.CRYPTO_malloc.restype = ctypes.c_void_p
        try:
            lib.SSL_get0_verified_chain.argtypes = [ctypes.c_void_p]
            lib.SSL_get0_verified_chain.restype = ctypes.c_void_p
            lib.OPENSSL_sk_num.argtypes = [ctypes.c_void_p]
            lib.OPENSSL_sk_num.restype = ctypes.c_int
            lib.OPENSSL_sk_value.argtypes = [ctypes.c_void_p, ctypes.c_int]
            lib.OPENSSL_sk_value.restype = ctypes.c_void_p
            lib.i2d_X509.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
            lib.i2d_X509.restype = ctypes.c_int
        except AttributeError:  # pragma: no cover - OpenSSL < 1.1
            pass
        return lib
    return None


_LIB = _load()


def available() -> bool:
    return _LIB is not None


def _ssl_ctx(ctx: ssl.SSLContext) -> int:
    ptr = ctypes.c_void_p.from_address(id(ctx) + object.__basicsize__).value
    if not ptr:  # pragma: no cover - a context always has its SSL_CTX
        raise RuntimeError("SSLContext without SSL_CTX")
    return ptr


def set_verify_depth(ctx: ssl.SSLContext, depth: int) -> bool:
    """OpenSSL's verify depth: at most ``depth`` intermediate CAs between the peer's
    certificate and a trusted one. False when it cannot be set (see :func:`available`)."""
    if _LIB is None:
        return False
    _LIB.SSL_CTX_set_verify_depth(_ssl_ctx(ctx), depth)
    return True


class Stapler:
    """Staples ``response`` (a DER OCSP response, or None: nothing) to each handshake of
    the contexts :meth:`install` was given, when the client asks (status_request)."""

    def __init__(self) -> None:
        self.response: bytes | None = None
        self.stapled = 0  # handshakes that got a response
        self._cb = _STATUS_CB(self._status)

    def _status(self, ssl_ptr: int, arg: int) -> int:
        data = self.response
        if _LIB is None or not data:
            return _SSL_TLSEXT_ERR_NOACK
        buf = _LIB.CRYPTO_malloc(len(data), b"openssl_ext.py", 0)
        if not buf:  # pragma: no cover - out of memory
            return _SSL_TLSEXT_ERR_NOACK
        ctypes.memmove(buf, data, len(data))
        _LIB.SSL_ctrl(ssl_ptr, _SSL_CTRL_SET_TLSEXT_STATUS_REQ_OCSP_RESP, len(data), buf)
        self.stapled += 1
        return _SSL_TLSEXT_ERR_OK

    def install(self, ctx: ssl.SSLContext) -> bool:
        """Set the status callback on ``ctx``; False when that is not possible."""
        if _LIB is None:
            return False
        cb = ctypes.cast(self._cb, _GENERIC_CB)
        _LIB.SSL_CTX_callback_ctrl(_ssl_ctx(ctx), _SSL_CTRL_SET_TLSEXT_STATUS_REQ_CB, cb)
        return True


def _ssl_ptr(ssl_object: object) -> int | None:
    """The ``SSL *`` behind an ``ssl.SSLObject`` or ``ssl.SSLSocket`` (module docstring)."""
    inner = getattr(ssl_object, "_sslobj", None)
    context = getattr(inner, "context", None)
    if inner is None or context is None:
        return None
    base = id(inner) + object.__basicsize__
    size = ctypes.sizeof(ctypes.c_void_p)
    if ctypes.c_void_p.from_address(base + 2 * size).value != id(context):
        return None  # not the layout we know: PyObject *Socket; SSL *ssl; PySSLContext *ctx
    return ctypes.c_void_p.from_address(base + size).value or None


def verified_chain(ssl_object: object) -> list[bytes] | None:
    """The DER certificates of the chain OpenSSL verified for the peer (the peer's own
    first, the trust anchor last); None when it cannot be had (no verification, or see
    :func:`available`)."""
    if _LIB is None or not hasattr(_LIB, "SSL_get0_verified_chain"):
        return None
    ptr = _ssl_ptr(ssl_object)
    if ptr is None:
        return None
    stack = _LIB.SSL_get0_verified_chain(ptr)
    if not stack:
        return None
    out: list[bytes] = []
    for i in range(_LIB.OPENSSL_sk_num(stack)):
        x509 = _LIB.OPENSSL_sk_value(stack, i)
        size = _LIB.i2d_X509(x509, None)
        if size <= 0:
            return None
        buf = ctypes.create_string_buffer(size)
        cursor = ctypes.c_void_p(ctypes.addressof(buf))
        if _LIB.i2d_X509(x509, ctypes.byref(cursor)) != size:
            return None
        out.append(buf.raw)
    return out
