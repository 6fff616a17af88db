"""The physical model behind the synthetic dataset, and its counter-based random numbers.

Model
-----
1-D rate-independent elasto-plasticity with linear isotropic hardening, integrated
with the classical return mapping (radial return) at every point of the strain path:

    trial stress   s_tr = E (eps_j - eps_p)
    yield function f    = |s_tr| - (sigma_y + H alpha)
    if f > 0:      dgamma = f / (E + H);  eps_p += dgamma sign(s_tr);  alpha += dgamma
    stress         s_j  = s_tr - E dgamma sign(s_tr)

E (``data.physics.youngs_modulus``) is fixed; the two labels, in this order, are the
initial yield stress ``sigma_y`` and the hardening modulus ``H`` (MPa), each uniform in
its configured range and rounded to float32 before they enter the model, so stored
labels and curves agree exactly.

Strain path (per sample, ``cycles`` = C cycles, 2C monotone segments, piecewise linear):
cycle k (k = 0..C-1) loads to a new peak ``p_k = max_strain (k + 0.5 + 0.5 u) / C``
(so peaks strictly increase and the last one lies in [max_strain (C-0.5)/C, max_strain))
and then unloads partly, by a fraction r in [0.25, 0.95) of the elastic strain at the
peak (``v_k = p_k - r sigma(p_k) / E``): the stress stays tensile, no reverse yielding.
The ``n_points - 1`` strain steps are shared among the segments, 30 % equally and 70 %
in proportion to the segment's strain length (at least one step each), with the knots
on grid points, so every step within a segment has the same non-zero strain increment.

Conventions: the first point is the unstressed origin: strain exactly 0, stress 0 plus
noise, flag 1 (virgin loading starts there). For every later point j the flag
describes the step that reaches it: flag 1 (loading) when strain_j > strain_{j-1}, flag
0 (unloading) when strain_j < strain_{j-1}; a peak point has flag 1, the next point 0.
Gaussian noise of ``noise_std`` MPa is added to the stress only (strain and flag are
exact). The radius uniform of the Box-Muller transform has 2^-24 resolution, so
|noise| < 5.77 noise_std always (validation allows 6 noise_std).

Determinism
-----------
Sample i depends only on (seed, i): every random number is a SplitMix64 hash of a
counter built from (sample id, stream, index) and a key derived from the seed, computed
in numpy uint64 arithmetic (no Generator objects, nothing depends on shard or block
boundaries). Transcendental functions (log, cos, sin) are evaluated with fixed
polynomials using only IEEE-754 correctly rounded operations (+, -, *, /, sqrt), so the
bits do not depend on the numpy build or the CPU's SIMD level either (numpy 1.26 and 2.4
give identical arrays; tests/test_data.py pins a checksum of the first samples).

Only numpy is imported here, so the model can be used from either environment.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from hvdscale.config.load import data_section, read_config_file, validate_config
from hvdscale.errors import ConfigError, UserError

GENERATOR_NAME = "hvdscale-elastoplastic-1d"
GENERATOR_VERSION = 1
CHANNEL_NAMES = ("strain", "stress", "flag")
LABEL_NAMES = ("yield_stress", "hardening_modulus")

# Random streams (part of the counter); never reuse a number for something else.
STREAM_LABELS = 1  # index 0: yield stress, 1: hardening modulus
STREAM_PATH = 2  # index 2k: peak of cycle k, 2k+1: unloading fraction of cycle k
STREAM_NOISE = 3  # index m: the pair of noise values for points 2m and 2m+1
STREAM_SPLIT = 4  # index 0: train/val/test decision (split_assign)

UNLOAD_MIN, UNLOAD_MAX = 0.25, 0.95
EQUAL_SHARE = 0.3  # share of the strain steps divided equally among the segments
NOISE_BOUND_SIGMAS = 6.0  # |noise| < 5.77 sigma by construction; validation allows this

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_SEED_SALT = 0x6876647363616C65  # "hvdscale"
_ID_SHIFT = np.uint64(24)
_STREAM_SHIFT = np.uint64(16)
MAX_INDEX = 1 << 16  # indices per stream and sample
MAX_SAMPLE_ID = 1 << 40


@dataclass(frozen=True)
class GeneratorParams:
    """Everything the generated arrays depend on (besides the sample ids)."""

    seed: int
    n_samples: int
    n_points: int
    youngs_modulus: float
    max_strain: float
    cycles: int
    noise_std: float
    yield_stress_min: float
    yield_stress_max: float
    hardening_modulus_min: float
    hardening_modulus_max: float
    yield_stress_unit: str = "MPa"
    hardening_modulus_unit: str = "MPa"
    generator: str = GENERATOR_NAME
    generator_version: int = GENERATOR_VERSION

    @classmethod
    def from_config(cls, cfg: dict) -> GeneratorParams:
        """From a data-section config ``{"seed": ..., "data": {...}}`` with defaults filled."""
        d = cfg["data"]
        ph, lab = d["physics"], d["labels"]
        p = cls(
            seed=int(cfg["seed"]),
            n_samples=int(d["n_samples"]),
            n_points=int(d["n_points"]),
            youngs_modulus=float(ph["youngs_modulus"]),
            max_strain=float(ph["max_strain"]),
            cycles=int(ph["cycles"]),
            noise_std=float(ph["noise_std"]),
            yield_stress_min=float(lab["yield_stress"]["min"]),
            yield_stress_max=float(lab["yield_stress"]["max"]),
            hardening_modulus_min=float(lab["hardening_modulus"]["min"]),
            hardening_modulus_max=float(lab["hardening_modulus"]["max"]),
            yield_stress_unit=str(lab["yield_stress"]["unit"]),
            hardening_modulus_unit=str(lab["hardening_modulus"]["unit"]),
        )
        p.check()
        return p

    def check(self) -> None:
        if self.n_points - 1 < 2 * self.cycles:
            raise UserError(
                f"config key data.n_points: got {self.n_points}; expected at least 2 * "
                f"data.physics.cycles + 1 = {2 * self.cycles + 1} (every loading and unloading "
                "segment needs a strain step)"
            )
        if (self.n_points + 1) // 2 > MAX_INDEX or self.n_samples > MAX_SAMPLE_ID:
            raise UserError(
                "config key data.n_points / data.n_samples: too large for the counter layout"
            )

    @property
    def label_units(self) -> tuple[str, str]:
        return (self.yield_stress_unit, self.hardening_modulus_unit)

    @property
    def label_min(self) -> np.ndarray:
        return np.array([self.yield_stress_min, self.hardening_modulus_min], dtype=np.float64)

    @property
    def label_max(self) -> np.ndarray:
        return np.array([self.yield_stress_max, self.hardening_modulus_max], dtype=np.float64)

    def as_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))


def load_data_config(path: str | Path) -> dict:
    """Read the data-stage config JSON (``hvdscale write-config --section data``).

    The file is validated again against the config schema (defaults filled), and the
    data section ``{"seed": ..., "data": {...}}`` is returned. Errors are ConfigError
    (a UserError-like message naming the file and the key).
    """
    path = Path(path)
    raw = read_config_file(path)
    if "data" not in raw or "seed" not in raw:
        raise ConfigError(f"config file {path}: expected a JSON object with keys 'seed' and 'data'")
    try:
        wl = {"workload": raw["workload"]} if "workload" in raw else {}
        cfg = validate_config({"seed": raw["seed"], "data": raw["data"], **wl})
    except ConfigError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    sec = data_section(cfg)
    GeneratorParams.from_config(sec)
    return sec


def add_data_config_argument(p) -> None:
    """``--config``: the data-stage config JSON of generate-shard, validate-shard, split-dataset."""
    p.add_argument(
        "--config",
        required=True,
        help="data-stage config JSON {'seed': ..., 'data': {...}} "
        "(hvdscale write-config --section data)",
    )


# --------------------------------------------------------------------------- random numbers


def _seed_key(seed: int) -> np.ndarray:
    k = np.array([(int(seed) ^ _SEED_SALT) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64)
    _mix64(k)
    return k


def _mix64(x: np.ndarray, tmp: np.ndarray | None = None) -> np.ndarray:
    """SplitMix64 finaliser, in place on a uint64 array (wrap-around arithmetic)."""
    if tmp is None:
        tmp = np.empty_like(x)
    np.right_shift(x, np.uint64(30), out=tmp)
    np.bitwise_xor(x, tmp, out=x)
    np.multiply(x, _M1, out=x)
    np.right_shift(x, np.uint64(27), out=tmp)
    np.bitwise_xor(x, tmp, out=x)
    np.multiply(x, _M2, out=x)
    np.right_shift(x, np.uint64(31), out=tmp)
    np.bitwise_xor(x, tmp, out=x)
    return x


def hash_counters(seed: int, ids: np.ndarray, stream: int, indices: np.ndarray) -> np.ndarray:
    """64 random bits for every (sample id, index) pair: shape (len(ids), len(indices)).

    counter = id << 24 | stream << 16 | index;  bits = mix64(counter * GAMMA + key(seed)).
    """
    ids = np.asarray(ids, dtype=np.int64)
    indices = np.asarray(indices, dtype=np.uint64)
    base = ids.astype(np.uint64)
    np.left_shift(base, _ID_SHIFT, out=base)
    np.bitwise_or(base, np.uint64(stream) << _STREAM_SHIFT, out=base)
    x = np.add(base[:, None], indices[None, :])
    np.multiply(x, _GAMMA, out=x)
    np.add(x, _seed_key(seed), out=x)
    return _mix64(x)


def uniforms(seed: int, ids: np.ndarray, stream: int, n: int) -> np.ndarray:
    """float64 uniforms in [0, 1) with 53 random bits: shape (len(ids), n)."""
    bits = hash_counters(seed, ids, stream, np.arange(n, dtype=np.uint64))
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


# Polynomial coefficients (Taylor), float32.
_LN2 = np.float32(math.log(2.0))
_HALF_PI = np.float32(math.pi / 2)
_COS = [np.float32((-1) ** k / math.factorial(2 * k)) for k in range(7)]  # up to theta^12
_SIN = [np.float32((-1) ** k / math.factorial(2 * k + 1)) for k in range(7)]  # up to theta^13


def _ln_unit(u: np.ndarray) -> np.ndarray:
    """Natural log of positive normal float32 values, |error| < 2e-7; integer and basic ops only.

    Reduction as in musl's logf: u = m 2^e with m in [sqrt(1/2), sqrt(2)) taken from the
    bits, then ln m = 2 atanh(t), t = (m - 1) / (m + 1), |t| <= 0.1716, by its series.
    """
    ix = u.view(np.int32) - np.int32(0x3F3504F3)
    e = (ix >> np.int32(23)).astype(np.float32)
    ix &= np.int32(0x7FFFFF)
    ix += np.int32(0x3F3504F3)
    m = ix.view(np.float32)
    t = m + np.float32(1.0)
    m -= np.float32(1.0)
    np.divide(m, t, out=t)  # t
    t2 = t * t
    p = t2 * np.float32(1.0 / 9.0)
    p += np.float32(1.0 / 7.0)
    p *= t2
    p += np.float32(1.0 / 5.0)
    p *= t2
    p += np.float32(1.0 / 3.0)
    p *= t2
    p += np.float32(1.0)
    p *= t
    p *= np.float32(2.0)  # ln m
    e *= _LN2
    p += e
    return p


def _poly_even(x2: np.ndarray, coefs) -> np.ndarray:
    p = np.full_like(x2, coefs[-1])
    for c in coefs[-2::-1]:
        p *= x2
        p += c
    return p


def normals(seed: int, ids: np.ndarray, stream: int, n: int) -> np.ndarray:
    """float32 standard normals (Box-Muller), shape (len(ids), n), |z| < 5.77.

    One 64-bit hash gives a pair: 24 bits for the radius uniform u1 in (0, 1], 24 bits
    for an angle in [0, pi/2) and two sign bits (a uniform angle on the circle).
    """
    npairs = (n + 1) // 2
    bits = hash_counters(seed, ids, stream, np.arange(npairs, dtype=np.uint64))
    u1 = ((bits >> np.uint64(40)) + np.uint64(1)).astype(np.float32)
    u1 *= np.float32(2.0**-24)  # (0, 1]
    r = _ln_unit(u1)
    r *= np.float32(-2.0)
    np.sqrt(r, out=r)
    theta = ((bits >> np.uint64(16)) & np.uint64(0xFFFFFF)).astype(np.float32)
    theta *= np.float32(2.0**-24) * _HALF_PI  # [0, pi/2)
    th2 = theta * theta
    c = _poly_even(th2, _COS)
    s = _poly_even(th2, _SIN)
    s *= theta
    c *= r
    s *= r
    # random signs: flip the float32 sign bit with bits 0 and 1 of the hash
    signs = (bits & np.uint64(3)).astype(np.uint32)
    cv = c.view(np.uint32)
    sv = s.view(np.uint32)
    cv ^= (signs & np.uint32(1)) << np.uint32(31)
    sv ^= (signs >> np.uint32(1)) << np.uint32(31)
    out = np.empty((len(ids), 2 * npairs), dtype=np.float32)
    out[:, 0::2] = c
    out[:, 1::2] = s
    return out[:, :n] if n != 2 * npairs else out


def split_uniform(seed: int, ids: np.ndarray) -> np.ndarray:
    """The per-sample uniform deciding the split (split_assign)."""
    return uniforms(seed, ids, STREAM_SPLIT, 1)[:, 0]


def split_is_train(seed: int, ids: np.ndarray, train_fraction: float) -> np.ndarray:
    """True where a sample belongs to the train share (train and validation splits)."""
    return split_uniform(seed, ids) < float(train_fraction)


# split codes of split_assign, in the order of hvdscale.data.split.SPLITS
SPLIT_CODES = {"train": 0, "val": 1, "test": 2}


def split_assign(
    seed: int, ids: np.ndarray, train_fraction: float, val_fraction: float
) -> np.ndarray:
    """The split of every sample (int8 codes of SPLIT_CODES), from one uniform u per (seed, id).

    u < train_fraction x val_fraction: val; below train_fraction: train; else test. So
    the validation split is val_fraction of the train share (in expectation), the test
    split is the same as without a validation split, and nothing depends on shard or
    worker counts.
    """
    u = split_uniform(seed, ids)
    out = np.full(len(u), SPLIT_CODES["test"], dtype=np.int8)
    out[u < float(train_fraction)] = SPLIT_CODES["train"]
    out[u < float(train_fraction) * float(val_fraction)] = SPLIT_CODES["val"]
    return out


# --------------------------------------------------------------------------- the model


def _point_major(n_points: int, n: int) -> np.ndarray:
    """An uninitialised (n_points, n) float64 array whose row stride is not a power of two.

    Transposing arrays with power-of-two row strides (block sizes like 4096) thrashes the
    cache (every element maps to the same cache set) and is 5-10x slower.
    """
    return np.empty((n_points, n + 8), dtype=np.float64)[:, :n]


def sample_labels(p: GeneratorParams, ids: np.ndarray) -> np.ndarray:
    """Labels (n, 2) float32: yield stress and hardening modulus, uniform in their ranges."""
    u = uniforms(p.seed, ids, STREAM_LABELS, 2)
    lo, hi = p.label_min, p.label_max
    lab = lo[None, :] + u * (hi - lo)[None, :]
    return lab.astype(np.float32)


def strain_path(p: GeneratorParams, ids: np.ndarray, sigma_y: np.ndarray, hard: np.ndarray):
    """Strain (n_points, n) float64, point-major, and loading flag (n, n_points) bool, sample-major.

    Every step of a segment adds the same strain increment (the strain is the running
    sum of the increments, in point order), so it is strictly monotone within a segment.

    ``sigma_y`` and ``hard`` are float64 arrays (n,) of the (float32-rounded) labels.
    """
    n = len(ids)
    C, T, E = p.cycles, p.n_points - 1, p.youngs_modulus
    u = uniforms(p.seed, ids, STREAM_PATH, 2 * C)
    k = np.arange(C, dtype=np.float64)
    peaks = p.max_strain * (k[None, :] + 0.5 + 0.5 * u[:, 0::2]) / C  # (n, C)
    eps_y = sigma_y / E
    e_t = E * hard / (E + hard)  # elasto-plastic tangent modulus
    sig_peak = np.where(
        peaks <= eps_y[:, None],
        E * peaks,
        sigma_y[:, None] + e_t[:, None] * (peaks - eps_y[:, None]),
    )
    r = UNLOAD_MIN + (UNLOAD_MAX - UNLOAD_MIN) * u[:, 1::2]
    valleys = peaks - r * sig_peak / E
    knots = np.zeros((n, 2 * C + 1), dtype=np.float64)
    knots[:, 1::2] = peaks
    knots[:, 2::2] = valleys
    seg_len = np.abs(np.diff(knots, axis=1))  # (n, 2C)
    w = EQUAL_SHARE / (2 * C) + (1.0 - EQUAL_SHARE) * seg_len / seg_len.sum(axis=1, keepdims=True)
    bounds = np.zeros((n, 2 * C + 1), dtype=np.int64)
    bounds[:, 1:] = np.rint(np.cumsum(w, axis=1) * T).astype(np.int64)
    bounds[:, -1] = T
    for s in range(1, 2 * C):  # at least one step per segment
        bounds[:, s] = np.clip(bounds[:, s], bounds[:, s - 1] + 1, T - (2 * C - s))
    steps = np.diff(bounds, axis=1)  # (n, 2C), >= 1, sums to T per sample
    slopes = np.diff(knots, axis=1) / steps  # strain increment of every step of a segment
    eps = _point_major(p.n_points, n)
    eps[0] = 0.0
    eps[1:] = np.repeat(slopes.ravel(), steps.ravel()).reshape(n, T).T
    for j in range(1, p.n_points):  # running sum over points, vectorised over samples
        np.add(eps[j], eps[j - 1], out=eps[j])
    seg_load = np.tile(np.array([True, False]), C * n)
    load = np.ones((n, p.n_points), dtype=bool)
    load[:, 1:] = np.repeat(seg_load, steps.ravel()).reshape(n, T)
    return eps, load


def return_mapping(eps: np.ndarray, sigma_y: np.ndarray, hard: np.ndarray, E: float) -> np.ndarray:
    """Stress (n_points, n) float64 for strain histories ``eps`` (n_points, n), point-major.

    Radial return for 1-D plasticity with linear isotropic hardening; loops over the
    points, vectorised over the samples. Starts from the virgin state.
    """
    n_points, n = eps.shape
    sig = _point_major(n_points, n)
    eps_p = np.zeros(n)
    alpha = np.zeros(n)
    trial = np.empty(n)
    f = np.empty(n)
    sgn = np.empty(n)
    inv = 1.0 / (E + hard)
    for j in range(n_points):
        np.subtract(eps[j], eps_p, out=trial)
        trial *= E
        np.multiply(hard, alpha, out=f)
        f += sigma_y
        np.subtract(np.abs(trial, out=sgn), f, out=f)  # |trial| - radius
        np.maximum(f, 0.0, out=f)
        f *= inv  # dgamma
        alpha += f
        np.sign(trial, out=sgn)
        f *= sgn  # dgamma * sign
        eps_p += f
        f *= E
        np.subtract(trial, f, out=sig[j])
    return sig


def generate_block(p: GeneratorParams, ids: np.ndarray, out: np.ndarray | None = None):
    """Curves (n, n_points, 3) float32 and labels (n, 2) float32 for the given sample ids."""
    ids = np.asarray(ids, dtype=np.int64)
    n = len(ids)
    labels = sample_labels(p, ids)
    sy = labels[:, 0].astype(np.float64)
    hh = labels[:, 1].astype(np.float64)
    eps, load = strain_path(p, ids, sy, hh)
    sig = return_mapping(eps, sy, hh, p.youngs_modulus)
    if out is None:
        out = np.empty((n, p.n_points, 3), dtype=np.float32)
    out[:, :, 0] = eps.T
    if p.noise_std > 0:
        z = normals(p.seed, ids, STREAM_NOISE, p.n_points)
        z *= np.float32(p.noise_std)
        np.add(sig.T, z, out=out[:, :, 1], casting="unsafe")  # float64 sum, one rounding
    else:
        out[:, :, 1] = sig.T
    out[:, :, 2] = load
    return out, labels
