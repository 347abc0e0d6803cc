"""Model folders read with transformers' `from_pretrained`, on the project's own code path.

Every transformers load in the pipeline goes through here (wav2vec2 for FlashHead, the
release's wav2vec2 for LiveAvatar's speech encoder, the umT5 tokenizer), so one place says
which of the library's defaults Facecast turns off:

- `local_files_only`: a folder on disk is read, nothing is ever downloaded;
- `use_kernels=False` (models only): from transformers 5.25 `from_pretrained` turns the Hub's
  kernels on by default, which refuses to load without the `kernels` package and, with
  it, swaps layers for kernels fetched from the Hub. Facecast's models run the library's
  own torch layers everywhere (the CPU tests, the parity fixtures, the GPU engine).
  transformers takes the argument from 4.53 on (pyproject's lower bound).

When the library refuses anyway, the error is a `LibraryError` naming the library, its
installed version and its own first line: the user's folder is not blamed for it.
"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path
from typing import Any, TypeVar

from pipeline.errors import LibraryError

# keyword arguments of every model's `from_pretrained` (see the module docstring)
MODEL_OPTIONS: dict[str, Any] = {"local_files_only": True, "use_kernels": False}
# feature extractors and tokenizers run no layers: only the offline switch applies
FILE_OPTIONS: dict[str, Any] = {"local_files_only": True}

T = TypeVar("T")


def load_model(cls: type[T], folder: Path, what: str) -> T:
    """`cls.from_pretrained(folder)` for a transformers model class, with MODEL_OPTIONS."""
    return _load(cls, folder, what, MODEL_OPTIONS)


def load_files(cls: Any, folder: Path, what: str) -> Any:
    """`cls.from_pretrained(folder)` for a feature extractor or tokenizer class (untyped:
    `AutoTokenizer` gives an instance of another class)."""
    return _load(cls, folder, what, FILE_OPTIONS)


def library_refusal(library: str, folder: Path, what: str, exc: BaseException) -> LibraryError:
    """One line: '<library> <version> refused to load <folder> as <what>: <its reason>'."""
    lines = str(exc).strip().splitlines()
    reason = lines[0] if lines else type(exc).__name__
    return LibraryError(
        f"{library} {version(library)} refused to load {folder} as {what}: {reason}"
    )


def _load(cls: Any, folder: Path, what: str, options: dict[str, Any]) -> Any:
    # the errors transformers raises for a folder it will not read; anything else is a bug
    # and keeps its traceback
    try:
        return cls.from_pretrained(folder, **options)
    except (OSError, ValueError, RuntimeError, ImportError) as exc:
        raise library_refusal("transformers", folder, what, exc) from None
