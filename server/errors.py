"""What the lab refuses, with the HTTP status each refusal maps to."""

from __future__ import annotations


class LabError(Exception):
    """A request the lab refuses; `status` is the HTTP status it maps to."""

    status = 400

    def __init__(self, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class NotFound(LabError):
    status = 404


class Forbidden(LabError):
    status = 403


class Conflict(LabError):
    status = 409


class BadInput(LabError):
    status = 422


class TooMany(LabError):
    status = 429


class Unavailable(LabError):
    """The lab cannot take more right now (its queue is full, its disk nearly so)."""

    status = 503


__all__ = ["BadInput", "Conflict", "Forbidden", "LabError", "NotFound", "TooMany", "Unavailable"]
