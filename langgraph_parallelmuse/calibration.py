"""Calibrated thresholds: branch wherever a region is unusually uncertain, stop what is unusually unsure.

The paper branches at a fixed top-k steps per trajectory. A calibration instead learns, from
earlier trajectories of the same model and task (other questions than the ones it is used on),
the perplexity quantile above which a step counts as uncertain, and branches at every such step
(most uncertain first, capped by the budget; online branching forks at once when a finished step
crosses it). It also learns DeepConf's confidence floor: the quantile of the trajectories' lowest
sliding-window confidence below which ``early_stop`` ends a trajectory. It is a small JSON file, so
one calibration serves many runs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.uncertainty import CONFIDENCE_WINDOW, REGIONS_OF_MODE

#: Share of calibration steps below the branching threshold (the top fifth of steps fork).
DEFAULT_QUANTILE = 0.8


def quantile_of(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` by linear interpolation.

    Example:
        >>> quantile_of([1.0, 2.0, 3.0, 4.0], 0.5)
        2.5
    """
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class Calibration:
    """Per-region perplexity thresholds learned from earlier trajectories.

    Example:
        >>> steps = [{"reasoning": r, "exploration": e, "all": r} for r, e in [(1, 9), (2, 3), (3, 1), (4, None)]]
        >>> cal = Calibration.fit([steps], quantile=0.5, estimator="nll")
        >>> cal.thresholds["reasoning"], cal.thresholds["exploration"]
        (2.5, 3.0)
        >>> cal.excess({"reasoning": 5.0, "exploration": 1.0}, mode="mixed")
        ('reasoning', 2.0)
    """

    estimator: str
    quantile: float
    thresholds: dict[str, float]
    samples: dict[str, int]
    # DeepConf's early-stop floor: a quantile of the trajectories' lowest group confidence.
    confidence_floor: float | None = None
    confidence_window: int = CONFIDENCE_WINDOW
    confidence_samples: int = 0

    @classmethod
    def fit(
        cls,
        uncertainties: Iterable[Iterable[Mapping[str, float | None]]],
        *,
        quantile: float = DEFAULT_QUANTILE,
        estimator: str = "nll",
        confidences: Iterable[float | None] = (),
        stop_quantile: float = 0.1,
    ) -> Calibration:
        """Thresholds at ``quantile`` of each region's step perplexities.

        Args:
            uncertainties: Per trajectory, its per-step region scores (``Trajectory["uncertainty"]``).
            quantile: Share of steps that will *not* qualify for branching, in (0, 1).
            estimator: The estimator the scores were computed with (checked when used).
            confidences: Per trajectory, its lowest group confidence (``stats["lowest_confidence"]``).
            stop_quantile: Share of such trajectories that ``early_stop`` would have stopped.
        """
        for name, value in (("quantile", quantile), ("stop_quantile", stop_quantile)):
            if not 0.0 < value < 1.0:
                raise ConfigError(f"{name}={value}: use a value strictly between 0 and 1")
        values: dict[str, list[float]] = {r: [] for r in ("reasoning", "exploration", "all")}
        try:
            for steps in uncertainties:
                for step in steps:
                    for region, vals in values.items():
                        if step.get(region) is not None:
                            vals.append(float(step[region]))
            floors = [float(c) for c in confidences if c is not None]
        except (ValueError, TypeError, AttributeError) as exc:
            raise ConfigError(
                f"a step's scores or a confidence are not numbers ({exc}): the runs are damaged; "
                "calibrate from other runs"
            ) from exc
        if not any(values.values()):
            raise ConfigError("no scored steps to calibrate from: run some trajectories with logprobs first")
        # A perplexity is at least 1 and a confidence at least 0: anything else is a damaged record, and
        # a threshold fitted on it would be refused by load() (the file this wrote could never be used).
        bad = [v for vals in values.values() for v in vals if not (math.isfinite(v) and v >= 1.0)]
        bad += [c for c in floors if not (math.isfinite(c) and c >= 0.0)]
        if bad:
            raise ConfigError(
                f"{len(bad)} step scores or confidences are not finite perplexities >= 1 or confidences >= 0 "
                f"(e.g. {bad[0]}): the runs are damaged; calibrate from other runs"
            )
        return cls(
            estimator=estimator,
            quantile=quantile,
            thresholds={r: quantile_of(v, quantile) for r, v in values.items() if v},
            samples={r: len(v) for r, v in values.items()},
            confidence_floor=quantile_of(floors, stop_quantile) if floors else None,
            confidence_samples=len(floors),
        )

    def excess(self, scores: Mapping[str, float | None], *, mode: str) -> tuple[str, float] | None:
        """The region of ``mode`` whose score most exceeds its threshold, as ``(region, score/threshold)``.

        ``None`` when no region of the mode has both a score and a threshold.
        """
        best: tuple[str, float] | None = None
        for region in REGIONS_OF_MODE.get(mode, ()):
            score, threshold = scores.get(region), self.thresholds.get(region)
            if score is None or not threshold:
                continue
            ratio = score / threshold
            if best is None or ratio > best[1]:
                best = (region, ratio)
        return best

    def save(self, path: str | Path) -> Path:
        """Write the calibration as JSON and return the path."""
        path = Path(path)
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    @staticmethod
    def load(path: str | Path) -> Calibration:
        """Read a calibration file written by :meth:`save` (or ``parallelmuse calibrate``).

        Raises:
            ConfigError: Missing or malformed file.
        """
        path = Path(path)
        try:
            stat = path.stat()
        except OSError as exc:
            raise ConfigError(
                f"calibration file {str(path)!r} not found: write one with `parallelmuse calibrate`"
            ) from exc
        if not path.is_file():
            raise ConfigError(
                f"calibration {str(path)!r} is not a file: pass the JSON file `parallelmuse calibrate` wrote"
            )
        return _load(str(path.resolve()), stat.st_mtime_ns)


@lru_cache(maxsize=16)
def _load(path: str, mtime_ns: int) -> Calibration:
    # Keyed by mtime: every node of a run resolves the config, the file is read once per change.
    try:
        data = json.loads(Path(path).read_text())
        cal = Calibration(
            estimator=str(data["estimator"]),
            quantile=float(data["quantile"]),
            thresholds={str(k): float(v) for k, v in data["thresholds"].items()},
            samples={str(k): int(v) for k, v in data.get("samples", {}).items()},
            confidence_floor=None if data.get("confidence_floor") is None else float(data["confidence_floor"]),
            confidence_window=int(data.get("confidence_window", CONFIDENCE_WINDOW)),
            confidence_samples=int(data.get("confidence_samples", 0)),
        )
    except (ValueError, KeyError, TypeError, AttributeError, OSError) as exc:
        raise ConfigError(
            f"calibration file {path!r} is malformed ({exc}): regenerate it with `parallelmuse calibrate`"
        ) from exc
    if not cal.thresholds:
        raise ConfigError(f"calibration file {path!r} has no thresholds: regenerate it with more trajectories")
    if problem := _problem(cal, window=data.get("confidence_window", CONFIDENCE_WINDOW)):
        raise ConfigError(
            f"calibration file {path!r} is malformed: {problem}; regenerate it with `parallelmuse calibrate`"
        )
    return cal


def _problem(cal: Calibration, *, window: object) -> str | None:
    """What makes a calibration read from a file unusable (``None``: nothing); ``window`` as written."""
    bad = {region: t for region, t in cal.thresholds.items() if not (math.isfinite(t) and t >= 1.0)}
    if bad:
        # A perplexity is at least 1; NaN, infinite or smaller thresholds would branch everywhere or nowhere.
        return f"thresholds {bad} must be finite perplexities >= 1"
    if not 0.0 < cal.quantile < 1.0:
        return f"quantile {cal.quantile} not in (0, 1)"
    floor = cal.confidence_floor
    if floor is not None and not (math.isfinite(floor) and floor >= 0.0):
        # A confidence is at least 0: a NaN floor would stop every trajectory, a negative one none.
        return f"confidence_floor {floor} must be a finite confidence >= 0"
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        # int() read 2.7 as 2, and a window of 0 divided by zero mid-rollout.
        return f"confidence_window {window!r} must be a whole number of tokens >= 1"
    return None
