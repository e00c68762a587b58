"""scikit-learn's ``random_state`` as the ``Generator`` our starts draw from, made cheaply."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from sklearn.utils import check_random_state

from ..stats.base import random_source

# One legacy source, reseeded for each int seed under the lock: making a new RandomState seeds a
# whole MT19937 from a SeedSequence before the legacy seeding replaces that state (0.1-0.2 ms,
# a tenth of a fit of 100 points); reseeding this one takes 2 us.
_LEGACY = np.random.RandomState(0)
_LEGACY_LOCK = threading.Lock()


def start_generator(random_state: Any) -> np.random.Generator:
    """``random_source(check_random_state(random_state))``: the same stream, for an int seed
    without making a ``RandomState``.

    Parameters
    ----------
    random_state : None, int or numpy.random.RandomState
        scikit-learn's ``random_state`` (already checked by the parameter constraints).

    Returns
    -------
    numpy.random.Generator
        Seeded by one draw from the legacy source: a given ``random_state`` always gives the
        same starts, and a ``RandomState`` instance moves on by that draw.
    """
    if isinstance(random_state, (int, np.integer)):
        with _LEGACY_LOCK:
            _LEGACY.seed(random_state)
            return random_source(_LEGACY)
    return random_source(check_random_state(random_state))
