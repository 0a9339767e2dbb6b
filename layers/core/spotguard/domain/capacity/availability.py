"""The capacity model: each pool's availability as alternating runs (spot available / not) whose chance
of ending depends on how long the run has lasted so far (a semi-Markov model: "hazard by age"), learnt
from the pool's own history, decayed, and smoothed towards a heavy-tailed prior.

`AvailabilityHistory` keeps the counts; `hazards` (fine age bins, for the one-pool plan) and
`coarse_hazards` (coarse bins, for the joint plan) read them. `stretch_hazards` and `stretch_coarse`
turn per-tick hazards into hazards per step of m ticks, for the plans' coarse far grid
(spotguard.domain.capacity.plans). numpy is needed here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Run ages (ticks, the current one included) at which the hazard bins start. Bin b covers
# [AGE_BINS[b], AGE_BINS[b+1]); the last is open. Narrow at first, where runs end most often.
AGE_BINS = (1, 2, 3, 4, 5, 6, 8, 10, 13, 17, 22, 29, 38, 50, 66, 88)
NB = len(AGE_BINS)
_WIDTH = np.array([AGE_BINS[i + 1] - AGE_BINS[i] for i in range(NB - 1)] + [0], dtype=float)
ADVANCE = np.where(_WIDTH > 0, 1.0 / np.maximum(_WIDTH, 1.0), 0.0)  # chance per tick to reach the next bin
NEXT_BIN = np.minimum(np.arange(NB) + 1, NB - 1)


def age_bin(age: int) -> int:
    b = 0
    while b + 1 < NB and age >= AGE_BINS[b + 1]:
        b += 1
    return b


class AvailabilityHistory:
    """One pool's availability, tick by tick, as decayed counts of how long runs last.

    `exposure[s, b]` counts ticks spent in a run of state s (0 unavailable, 1 available) at age bin b;
    `ends[s, b]` counts runs that ended there. The hazard of bin b is ends / exposure, smoothed towards
    the prior (a run of state s ends with chance 1/prior_mean_ticks[s] per tick) with weight `prior_ticks`.
    """

    def __init__(
        self,
        tick_hours: float,
        half_life_hours: float = 168.0,
        prior_mean_hours: tuple[float, float] = (1.0, 2.0),
        prior_ticks: float = 3.0,
        heavy_tailed_prior: bool = True,
    ) -> None:
        if tick_hours <= 0 or half_life_hours <= 0:
            raise ValueError("tick and half-life must be positive")
        self.tick_hours = tick_hours
        self.decay = 0.5 ** (tick_hours / half_life_hours)
        # The prior: heavy-tailed runs (the longer a run has lasted, the longer it is likely to last), a
        # hazard of 1 / (age + scale) per tick, the scale set so that a fresh run has the prior mean.
        ages = np.array(AGE_BINS, dtype=float) + (_WIDTH - 1).clip(0) / 2
        self.prior = np.stack(
            [
                np.full(NB, tick_hours / max(h, tick_hours))
                if not heavy_tailed_prior
                else 1.0 / (ages + max(h / tick_hours, 1.0))
                for h in prior_mean_hours
            ]
        )
        self.prior_ticks = prior_ticks
        self.exposure = np.zeros((2, NB))
        self.ends = np.zeros((2, NB))
        self.state: int | None = None
        self.age = 0

    def observe(self, available: bool) -> None:
        a = int(bool(available))
        self.exposure *= self.decay
        self.ends *= self.decay
        if self.state is None:
            self.state, self.age = a, 1
        elif a == self.state:
            self.age += 1
        else:
            self.ends[self.state, age_bin(self.age)] += 1.0
            self.state, self.age = a, 1
        self.exposure[a, age_bin(self.age)] += 1.0

    def observe_all(self, ticks: Sequence[bool]) -> None:
        for a in ticks:
            self.observe(a)

    def bin_if(self, available: bool) -> int:
        """The age bin of the current run if it is in state `available`, else 0: a run just starting."""
        return age_bin(self.age) if self.state == int(available) else 0

    def gap(self) -> None:
        """Observation stopped for a while: the current run's age is no longer known."""
        self.state, self.age = None, 0

    def hazards(self) -> np.ndarray:
        k = self.prior_ticks
        seen = self.exposure + k
        prior = self.prior
        h = np.where(seen > 0, (self.ends + k * prior) / np.maximum(seen, 1e-12), prior)
        return np.clip(h, 1e-4, 0.98)

    def expected_spot_ticks(self) -> float:
        """Expected ticks spot lasts from now, this one included (from the hazards): the rest of the
        current run if it is an available one, else a whole fresh run."""
        return self.expected_run_ticks(True)

    def expected_run_ticks(self, available: bool) -> float:
        """Expected ticks a run of this state lasts from now, this one included: the rest of the current
        run if it is of that state, else a whole fresh one. For an unavailable pool, when spot is
        expected back."""
        state = int(available)
        h = self.hazards()[state]
        age = self.age if self.state == state else 1
        total, survive = 1.0, 1.0
        for _ in range(400):
            survive *= 1.0 - h[age_bin(age)]
            total += survive
            age += 1
            if survive < 1e-4:
                break
        return total


# The joint plan's coarse age bins: unions of the fine ones above (so the same counts serve both).
COARSE = ((0,), (1, 2), (3, 4, 5), (6, 7, 8), (9, 10, 11), (12, 13, 14, 15))
NC = len(COARSE)
_CWIDTH = [AGE_BINS[COARSE[i + 1][0]] - AGE_BINS[COARSE[i][0]] for i in range(NC - 1)] + [0]
COARSE_ADVANCE = np.array([1.0 / w if w else 0.0 for w in _CWIDTH])
COARSE_NEXT = np.minimum(np.arange(NC) + 1, NC - 1)
COARSE_OF = np.array([next(c for c, g in enumerate(COARSE) if f in g) for f in range(NB)])


def coarse_hazards(history: AvailabilityHistory) -> np.ndarray:
    """(2, NC): the history's hazards on the coarse bins, from the same decayed counts and prior."""
    k = history.prior_ticks
    out = np.zeros((2, NC))
    for c, group in enumerate(COARSE):
        g = list(group)
        ends = history.ends[:, g].sum(1) + k * history.prior[:, g].mean(1)
        out[:, c] = ends / (history.exposure[:, g].sum(1) + k)
    return np.clip(out, 1e-4, 0.98)


def coarse_transitions(hazards: np.ndarray) -> np.ndarray:
    """(2NC, 2NC): one pool's chance to go from (available, coarse bin) to the next tick's."""
    n = 2 * NC
    p = np.zeros((n, n))
    for a in (0, 1):
        for b in range(NC):
            s, h = a * NC + b, hazards[a, b]
            p[s, (1 - a) * NC] += h
            p[s, a * NC + COARSE_NEXT[b]] += (1 - h) * COARSE_ADVANCE[b]
            p[s, a * NC + b] += (1 - h) * (1 - COARSE_ADVANCE[b])
    return p


def joint_state(history: AvailabilityHistory, available: bool) -> int:
    """A pool's state in the joint plan: availability and the coarse bin of its current run."""
    return int(available) * NC + COARSE_OF[history.bin_if(available)]


def _stretch(hazards: np.ndarray, bins: Sequence[Sequence[int]], starts: Sequence[int], m: int) -> np.ndarray:
    """Hazards per step of m ticks, on bins that start at the given ages counted in steps: a run of age
    A steps (fine ages (A-1)m+1 .. Am) ends within the step unless it survives each of its m ticks.
    `hazards[s, i]`: the per-tick hazard of a run of state s in bin i, which holds the fine age bins
    `bins[i]`. The hazard is the same across a bin, so the survival is a product over the bins of
    (1 - h) to the power of the ticks of the step in it: a few numbers, however long the step (not an
    array of its m ticks, which a deadline far off made hundreds of megabytes)."""
    edges = [*AGE_BINS, AGE_BINS[-1] * m + 1]  # fine bin b: ages edges[b] .. edges[b + 1] - 1
    ranges = [(edges[g[0]], edges[g[-1] + 1] - 1) for g in bins]
    log_keep = np.log1p(-hazards)  # (2, bins)
    out = np.empty((2, len(starts)))
    for b, a in enumerate(starts):
        lo, hi = (a - 1) * m + 1, a * m
        ticks = np.array([max(0, min(hi, top) - max(lo, bottom) + 1) for bottom, top in ranges], dtype=float)
        out[:, b] = -np.expm1(log_keep @ ticks)
    return np.clip(out, 1e-4, 0.98)


def stretch_hazards(hazards: np.ndarray, m: int) -> np.ndarray:
    """(2, NB) per-tick hazards on the fine bins -> per step of m ticks, the same bins counted in steps."""
    if m == 1:
        return hazards
    return _stretch(hazards, [(b,) for b in range(NB)], AGE_BINS, m)


def stretch_coarse(hazards: np.ndarray, m: int) -> np.ndarray:
    """(2, NC) per-tick hazards on the coarse bins -> per step of m ticks, the same bins counted in
    steps."""
    if m == 1:
        return hazards
    return _stretch(hazards, COARSE, [AGE_BINS[g[0]] for g in COARSE], m)


def step_bin(fine_bin: int, m: int) -> int:
    """The fine bin a run is in, as the bin of the same age counted in steps of m ticks."""
    return age_bin(-(-AGE_BINS[fine_bin] // m))


def step_coarse_bin(coarse_bin: int, m: int) -> int:
    return int(COARSE_OF[step_bin(COARSE[coarse_bin][0], m)])
