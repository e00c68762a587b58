"""Character-level tokenizer and an offline demo corpus from the Python standard library."""

from __future__ import annotations

import importlib
import inspect

import numpy as np
from numpy.typing import ArrayLike

# Modules whose docstrings are long English prose; read locally, so demos need no download.
_CORPUS_MODULES = (
    "argparse",
    "collections",
    "datetime",
    "decimal",
    "email",
    "functools",
    "inspect",
    "itertools",
    "json",
    "logging",
    "pathlib",
    "random",
    "re",
    "statistics",
    "string",
    "textwrap",
    "threading",
    "unittest",
    "zipfile",
)


class CharTokenizer:
    """Maps each distinct character of a text to an id in ``[0, vocab_size)``.

    Parameters
    ----------
    alphabet : str
        The characters, each once, in id order.

    Raises
    ------
    ValueError
        An empty alphabet or one with a repeated character.

    See Also
    --------
    stdlib_text : A text to fit it on.

    Examples
    --------
    >>> from mixle_nb.neural import CharTokenizer
    >>> tok = CharTokenizer.fit("hello world")
    >>> tok.vocab_size
    8
    >>> ids = tok.encode("hello")
    >>> ids.tolist(), tok.decode(ids)
    ([3, 2, 4, 4, 5], 'hello')
    """

    def __init__(self, alphabet: str):
        if len(set(alphabet)) != len(alphabet) or not alphabet:
            raise ValueError("alphabet must be a non-empty string of distinct characters")
        self.alphabet = alphabet
        self._index = {c: i for i, c in enumerate(alphabet)}

    @classmethod
    def fit(cls, text: str) -> CharTokenizer:
        """The tokenizer of the distinct characters of ``text``, in sorted order.

        Parameters
        ----------
        text : str
            The text (at least one character).

        Returns
        -------
        CharTokenizer
            Its tokenizer.
        """
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        """The number of ids (the alphabet's length)."""
        return len(self.alphabet)

    def encode(self, text: str) -> np.ndarray:
        """The ids of the characters of ``text``.

        Parameters
        ----------
        text : str
            Text made of the alphabet's characters.

        Returns
        -------
        numpy.ndarray
            One id per character (``uint8`` for at most 256 ids, else ``int32``).

        Raises
        ------
        ValueError
            A character that is not in the alphabet.
        """
        try:
            ids = [self._index[c] for c in text]
        except KeyError as err:
            raise ValueError(
                f"character {err.args[0]!r} is not in the tokenizer's alphabet; "
                "fit the tokenizer on text that contains it"
            ) from None
        dtype = np.uint8 if self.vocab_size <= 256 else np.int32
        return np.asarray(ids, dtype=dtype)

    def decode(self, ids: ArrayLike) -> str:
        """The text of a sequence of ids.

        Parameters
        ----------
        ids : array_like of int
            Token ids.

        Returns
        -------
        str
            Their characters, joined.
        """
        return "".join(self.alphabet[int(i)] for i in np.asarray(ids).ravel())


def stdlib_text(max_chars: int | None = None) -> str:
    """Docstrings of a fixed set of standard-library modules, joined: real prose, offline.

    The exact text depends on the Python version.

    Parameters
    ----------
    max_chars : int, optional
        Keep only the first ``max_chars`` characters (default: all of it).

    Returns
    -------
    str
        The text.

    Examples
    --------
    >>> from mixle_nb.neural import stdlib_text
    >>> len(stdlib_text(500))
    500
    """
    parts = []
    for name in _CORPUS_MODULES:
        module = importlib.import_module(name)
        for obj in (module, *(v for k, v in sorted(vars(module).items()) if not k.startswith("_"))):
            doc = inspect.getdoc(obj) if (obj is module or getattr(obj, "__module__", None) == name) else None
            if doc:
                parts.append(doc)
    text = "\n\n".join(dict.fromkeys(parts))  # drop repeats, keep order
    return text if max_chars is None else text[:max_chars]
