"""API errors: each becomes ``{"code": ..., "message": ...}`` with its HTTP status."""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BAD_REQUEST", message)


def not_found(message: str) -> ApiError:
    return ApiError(404, "NOT_FOUND", message)


def conflict(message: str) -> ApiError:
    return ApiError(409, "CONFLICT", message)


def not_configured(what: str) -> ApiError:
    return ApiError(501, "NOT_CONFIGURED", f"{what} is not configured on this node")
