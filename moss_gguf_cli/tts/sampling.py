"""Token sampling: repetition penalty, temperature, top-k, top-p, greedy (docs/ARCHITECTURE.md §5).

Order of operations, per row of logits:

1. repetition penalty (Hugging Face convention) on the tokens already seen in that
   row's history: a positive logit is divided by the penalty, a negative one multiplied;
2. temperature below GREEDY_BELOW (1e-5, vLLM's epsilon) means greedy: argmax, no random
   draw (a smaller one would only overflow the division that follows);
3. logits / temperature;
4. top-k (0 = off) keeps the k largest, chosen with argpartition (no full sort);
5. top-p (1.0 = off) keeps, in decreasing probability, every token whose preceding
   cumulative probability is still below p — so the token that crosses p is kept;
6. one uniform draw per row from the seeded `numpy.random.Generator`.

Candidates are ordered by (logit descending, id ascending) before the draw, so the
same seed and logits always pick the same token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import InputError, NumericError

# the ranges a request may ask for (the server refuses others, docs/serve-limits.md): within
# them, finite logits stay finite through the penalty and the temperature
GREEDY_BELOW = 1e-5  # a temperature under this is greedy (vLLM's _SAMPLING_EPS)
TEMPERATURE_MAX = 10.0
PENALTY_RANGE = (0.01, 10.0)
TOP_K_MAX = 1 << 20  # beyond any vocabulary: the same as 0 (off)
# the sampling keys a synth YAML holds and one request may change (every family's)
SAMPLING_KEYS = (
    "text_temperature",
    "text_top_p",
    "text_top_k",
    "audio_temperature",
    "audio_top_p",
    "audio_top_k",
    "audio_repetition_penalty",
)


class SamplingError(InputError):
    """The sampling settings left no finite logit to sample (what the request asked for).
    `setting` names the setting: "temperature" or "repetition_penalty"."""

    def __init__(self, setting: str, value: float):
        super().__init__(f"{setting} {value!r} leaves no finite logit to sample from",
                         hint=f"choose a {setting} inside the documented range")  # fmt: skip
        self.setting, self.value = setting, value

    def named(self, prefix: str) -> SamplingError:
        """The same error naming the setting as the config does (text_…, audio_…)."""
        return SamplingError(prefix + self.setting, self.value)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0

    @property
    def greedy(self) -> bool:
        return not self.temperature >= GREEDY_BELOW  # NaN too: never divide by it


def apply_repetition_penalty(logits: np.ndarray, seen: np.ndarray, penalty: float) -> None:
    """In place: logits[seen] / penalty where positive, * penalty otherwise."""
    if penalty == 1.0:
        return
    picked = logits[seen]
    with np.errstate(over="ignore", under="ignore"):  # checked by the caller, not warned
        logits[seen] = np.where(picked > 0, picked / penalty, picked * penalty)


def _candidates(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """(ids, probabilities) per row after temperature / top-k / top-p, ids sorted by logit.

    logits: (n, V) float32, already penalised. Returns arrays of shape (n, k).
    """
    n, vocab = logits.shape
    k = params.top_k if 0 < params.top_k < vocab else vocab
    if k < vocab:
        ids = np.argpartition(logits, vocab - k, axis=1)[:, vocab - k :]
        ids.sort(axis=1)  # canonical order first, so ties break by id below
    else:
        ids = np.broadcast_to(np.arange(vocab), (n, vocab))
    values = np.take_along_axis(logits, ids, axis=1).astype(np.float64)
    order = np.argsort(-values, axis=1, kind="stable")
    ids = np.take_along_axis(ids, order, axis=1)
    with np.errstate(over="ignore"):  # an overflow is checked just below
        values = np.take_along_axis(values, order, axis=1) / params.temperature
    top = values[:, :1]
    if not np.all(np.isfinite(top)):
        if np.all(np.isfinite(logits).any(axis=1)):  # finite before the division
            raise SamplingError("temperature", params.temperature)
        raise NumericError(
            "every candidate logit is -inf or NaN", hint="the backbone output is broken"
        )
    probs = np.exp(values - top)
    probs /= probs.sum(axis=1, keepdims=True)
    if params.top_p < 1.0:
        before = np.cumsum(probs, axis=1) - probs  # mass strictly ahead of each token
        probs[before >= params.top_p] = 0.0
    return ids, probs


def filter_probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Full-size probabilities after temperature / top-k / top-p (for tests and inspection)."""
    rows = np.atleast_2d(np.asarray(logits, dtype=np.float32))
    ids, probs = _candidates(rows, params)
    probs = probs / probs.sum(axis=1, keepdims=True)
    out = np.zeros(rows.shape, dtype=np.float64)
    np.put_along_axis(out, ids, probs, axis=1)
    return out.reshape(np.shape(logits))


def sample_rows(
    logits: np.ndarray,
    params: SamplingParams,
    rng: np.random.Generator,
    seen: np.ndarray | None = None,
) -> np.ndarray:
    """One token per row of (n, V) logits. `seen` (n, V) bool: each row's history.

    The logits are modified in place (penalty); pass a copy to keep them.
    """
    if seen is not None and params.repetition_penalty != 1.0:
        finite = np.isfinite(logits).any(axis=1)
        apply_repetition_penalty(logits, seen, params.repetition_penalty)
        if not np.array_equal(np.isfinite(logits).any(axis=1), finite):
            raise SamplingError("repetition_penalty", params.repetition_penalty)
    if params.greedy:
        return np.argmax(logits, axis=1)
    ids, probs = _candidates(logits, params)
    cumulative = np.cumsum(probs, axis=1)
    draws = rng.random(len(ids)) * cumulative[:, -1]
    picks = np.minimum((cumulative <= draws[:, None]).sum(axis=1), ids.shape[1] - 1)
    return ids[np.arange(len(ids)), picks]


def sample_one(
    logits: np.ndarray,
    params: SamplingParams,
    rng: np.random.Generator,
    seen: np.ndarray | None = None,
) -> int:
    """`sample_rows` for one 1-D row, the same token for the same logits and generator state.
    LOGITS is modified in place (penalty)."""
    return pick_one(logits, params, None if params.greedy else rng.random(), seen)


def pick_one(
    logits: np.ndarray,
    params: SamplingParams,
    draw: float | None,
    seen: np.ndarray | None = None,
) -> int:
    """sample_one with its uniform DRAW in [0, 1) given (unused when greedy), with a fraction
    of sample_rows' NumPy calls (a NumPy call costs 2-4 µs on a small CPU). LOGITS is
    modified in place (penalty).

    The finiteness checks run only when the best candidate is not finite: a penalty can only
    have left no finite logit (sample_rows' first check) if the best one is not finite."""
    picked = None
    if seen is not None and params.repetition_penalty != 1.0:
        penalty = params.repetition_penalty
        picked = logits[seen]
        with np.errstate(over="ignore", under="ignore"):  # checked below, not warned
            logits[seen] = np.where(picked > 0, picked / penalty, picked * penalty)
    if params.greedy:
        token = int(np.argmax(logits))
        if not math.isfinite(logits[token]):
            _penalty_check(logits, picked, params)
        return token
    vocab = logits.shape[0]
    k = params.top_k if 0 < params.top_k < vocab else vocab
    if k < vocab:
        ids = np.argpartition(logits, vocab - k)[vocab - k :]
    else:
        ids = np.arange(vocab)
    values = logits[ids].tolist()  # float32 to Python floats: exact
    if k > _PYTHON_TAIL or any(v != v for v in values):  # long rows and NaN: NumPy's order
        ids.sort()
        return _sample_sorted(logits, ids, params, draw, picked)
    # (logit descending, id ascending), as sample_rows orders them
    ranked = sorted(zip([-v for v in values], ids.tolist(), strict=True))
    t = params.temperature
    scaled = [-v / t for v, _ in ranked]  # float64 division, as sample_rows' NumPy one
    top = scaled[0]
    if not math.isfinite(top):
        _penalty_check(logits, picked, params)
        _finite_check(logits, params)
    probs = np.exp(np.array(scaled) - top)  # NumPy's exp and pairwise sum: the same bits
    probs = (probs / probs.sum()).tolist()
    cumulative, total = [], 0.0
    for p in probs:
        total += p  # sequential, as np.cumsum
        cumulative.append(total)
    if params.top_p < 1.0:
        cut = params.top_p
        total, kept = 0.0, []
        for c, p in zip(cumulative, probs, strict=True):
            kept.append(0.0 if c - p >= cut else p)
        cumulative = []
        for p in kept:
            total += p
            cumulative.append(total)
    draw *= cumulative[-1]
    pick = sum(1 for c in cumulative if c <= draw)
    return ranked[min(pick, k - 1)][1]


_PYTHON_TAIL = 64  # candidates ranked in Python at most (top-k 25 and 50 at Nano's defaults)


def _penalty_check(logits: np.ndarray, picked: np.ndarray | None, params: SamplingParams) -> None:
    """sample_rows' first check: the penalty left no finite logit where there was one (the
    unseen logits are unchanged, so 'there was one' means a seen one was finite)."""
    if picked is not None and not np.isfinite(logits).any() and np.isfinite(picked).any():
        raise SamplingError("repetition_penalty", params.repetition_penalty)


def _finite_check(logits: np.ndarray, params: SamplingParams) -> None:
    if np.isfinite(logits).any():
        raise SamplingError("temperature", params.temperature)
    raise NumericError("every candidate logit is -inf or NaN",
                       hint="the backbone output is broken")  # fmt: skip


def _sample_sorted(logits: np.ndarray, ids: np.ndarray, params: SamplingParams, draw: float,
                   picked: np.ndarray | None) -> int:  # fmt: skip
    """pick_one's NumPy tail over candidate IDS in ascending order."""
    values = logits[ids].astype(np.float64)
    order = np.argsort(-values, kind="stable")
    ids = ids[order]
    with np.errstate(over="ignore"):
        values = values[order] / params.temperature
    top = values[0]
    if not np.isfinite(top):
        _penalty_check(logits, picked, params)
        _finite_check(logits, params)
    probs = np.exp(values - top)
    probs /= probs.sum()
    if params.top_p < 1.0:
        probs[np.cumsum(probs) - probs >= params.top_p] = 0.0
    cumulative = np.cumsum(probs)
    draw *= cumulative[-1]
    return int(ids[min(int((cumulative <= draw).sum()), ids.shape[0] - 1)])


def sample_token(
    logits: np.ndarray,
    params: SamplingParams,
    rng: np.random.Generator,
    seen: np.ndarray | None = None,
) -> int:
    """One token from a 1-D logit vector (modified in place by a penalty)."""
    rows = logits.reshape(1, -1)
    return int(sample_rows(rows, params, rng, None if seen is None else seen.reshape(1, -1))[0])


class Sampler:
    """The text and audio sampling settings plus the one seeded generator they share."""

    def __init__(self, text: SamplingParams, audio: SamplingParams, seed: int | None = None):
        self.text_params = text
        self.audio_params = audio
        self.rng = np.random.default_rng(seed)

    def text(self, logits: np.ndarray) -> int:
        try:
            return sample_token(logits, self.text_params, self.rng)
        except SamplingError as exc:
            raise exc.named("text_") from None

    def pick(self, kind: str, logits: np.ndarray, draw: float,
             seen: np.ndarray | None = None) -> int:  # fmt: skip
        """One token of a 1-D row with the KIND ("text" or "audio") settings and a uniform
        DRAW (pick_one)."""
        params = self.text_params if kind == "text" else self.audio_params
        try:
            return pick_one(logits, params, draw, seen)
        except SamplingError as exc:
            raise exc.named(f"{kind}_") from None

    def audio(self, logits: np.ndarray, seen: np.ndarray | None = None) -> np.ndarray:
        try:
            return sample_rows(logits, self.audio_params, self.rng, seen)
        except SamplingError as exc:
            raise exc.named("audio_") from None
