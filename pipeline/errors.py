"""Typed exceptions for failures a user can fix (bad input, bad config, bad checkpoint).

The CLI prints these as one line on stderr without a traceback; anything else is a bug.
"""


class FacecastError(Exception):
    """Base class: a problem with what the user gave us, with a message saying how to fix it."""


class ConfigError(FacecastError):
    """An unknown config name, a bad key, or a value outside its allowed range."""


class MediaError(FacecastError):
    """A missing, unreadable, corrupt or unusable image or audio input."""


class CheckpointError(FacecastError):
    """A checkpoint that is missing, unreadable, or does not match the model's keys and shapes."""


class LibraryError(FacecastError):
    """A library (transformers, diffusers) that refused to load a model folder: the message
    names the library, its installed version and its own reason, not the user's folder."""


class PhotoError(MediaError):
    """A reference photo the photo stack cannot animate. `kind` says why, so a server can
    answer with the right status: "type" (not PNG/JPEG/WebP), "size" (too many bytes or
    pixels), "corrupt" (does not decode), "face" (no face, several, too small, cut off),
    "box" (a hand-drawn face box that is not four numbers, lies outside the photo or is too
    small)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind
