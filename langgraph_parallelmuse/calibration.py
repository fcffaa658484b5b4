"""Calibrated thresholds: branch wherever a region is unusually uncertain, stop what is unusually unsure.

The paper branches at a fixed top-k steps per trajectory. A calibration instead learns, from
earlier trajectories of the same model and task (other questions than the ones it is used on),
the perplexity quantile above which a step counts as uncertain, and branches at every such step
(most uncertain first, capped by the budget; online branching forks at once when a finished step
crosses it). It also learns DeepConf's confidence floor: the quantile of the trajectories' lowest
sliding-window confidence below which ``early_stop`` ends a trajectory. It is a small JSON file, so
one calibration serves many runs; it records what it was fitted on (model, questions, how many steps
and trajectories), so a run can tell whether it fits.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import get_args

from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.files import replacing
from langgraph_parallelmuse.logprobs import top_logprobs_problem
from langgraph_parallelmuse.uncertainty import CONFIDENCE_WINDOW, REGIONS_OF_MODE, Estimator

#: Share of calibration steps below the branching threshold (the top fifth of steps fork).
DEFAULT_QUANTILE = 0.8
#: Fewer steps of a region than this make its threshold noisy, and :meth:`Calibration.fit` warns.
MIN_STEPS = 50
#: Fewer trajectories than this (fewer questions, usually) make the thresholds and floor noisy: fit warns.
MIN_TRAJECTORIES = 20
# What a calibration records about where it came from; None when unknown (files written before).
_PROVENANCE = ("model", "top_logprobs", "questions", "trajectories")


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
        >>> with warnings.catch_warnings(record=True) as caught:  # four steps of one trajectory: few
        ...     warnings.simplefilter("always")
        ...     cal = Calibration.fit([steps], quantile=0.5, estimator="nll", questions=["q7"])
        >>> print(caught[0].message)  # doctest: +ELLIPSIS
        calibration thresholds from few samples (reasoning: 4 steps; ...; 1 trajectories): ...
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
    # Where it came from (None: not recorded, as in files written before these fields): the model
    # and backend the steps were scored on, the top logprobs they were scored with, the ids of the
    # questions fitted on (a run on them would test on its own calibration), and how many trajectories.
    model: str | None = None
    top_logprobs: int | None = None
    questions: tuple[str, ...] | None = None
    trajectories: int | None = None

    @classmethod
    def fit(
        cls,
        uncertainties: Iterable[Iterable[Mapping[str, float | None]]],
        *,
        quantile: float = DEFAULT_QUANTILE,
        estimator: str = "nll",
        confidences: Iterable[float | None] = (),
        stop_quantile: float = 0.1,
        model: str | None = None,
        top_logprobs: int | None = None,
        questions: Iterable[str] | None = None,
    ) -> Calibration:
        """Thresholds at ``quantile`` of each region's step perplexities.

        Warns (``UserWarning``) when a threshold comes from fewer than :data:`MIN_STEPS` steps of its region
        or from fewer than :data:`MIN_TRAJECTORIES` trajectories: runs would branch and stop more or less than asked.

        Args:
            uncertainties: Per trajectory, its per-step region scores (``Trajectory["uncertainty"]``).
            quantile: Share of steps that will *not* qualify for branching, in (0, 1).
            estimator: The estimator the scores were computed with (checked when used).
            confidences: Per trajectory, its lowest group confidence (``stats["lowest_confidence"]``).
            stop_quantile: Share of such trajectories that ``early_stop`` would have stopped.
            model: The model (and backend) the trajectories ran on, recorded in the file.
            top_logprobs: The top logprobs their steps were scored with, recorded in the file.
            questions: The ids of the questions the trajectories answered, recorded (once each, in
                order) so a run can refuse to be measured on them.

        Raises:
            ConfigError: A quantile outside (0, 1), no scored step, or damaged scores.

        Example:
            >>> runs, ids = [[{"reasoning": 1 + i % 5, "all": 2}] * 3 for i in range(20)], [f"q{i}" for i in range(20)]
            >>> cal = Calibration.fit(runs, quantile=0.5, model="embedded", top_logprobs=16, questions=ids)
            >>> cal.thresholds["reasoning"], cal.samples["reasoning"], cal.trajectories, cal.questions[:2]
            (3.0, 60, 20, ('q0', 'q1'))
        """
        for name, value in (("quantile", quantile), ("stop_quantile", stop_quantile)):
            if not 0.0 < value < 1.0:
                raise ConfigError(f"{name}={value}: use a value strictly between 0 and 1")
        values: dict[str, list[float]] = {r: [] for r in ("reasoning", "exploration", "all")}
        trajectories = 0
        try:
            for steps in uncertainties:
                trajectories += 1
                for step in steps:
                    for region, vals in values.items():
                        if step.get(region) is not None:
                            vals.append(float(step[region]))
            floors = [float(c) for c in confidences if c is not None]
        except (ValueError, TypeError, AttributeError, OverflowError) as exc:  # overflow: an int beyond a float
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
        _warn_if_few(values, trajectories=trajectories, floors=len(floors))
        return cls(
            estimator=estimator,
            quantile=quantile,
            thresholds={r: quantile_of(v, quantile) for r, v in values.items() if v},
            samples={r: len(v) for r, v in values.items()},
            confidence_floor=quantile_of(floors, stop_quantile) if floors else None,
            confidence_samples=len(floors),
            model=model,
            top_logprobs=top_logprobs,
            questions=None if questions is None else tuple(dict.fromkeys(str(q) for q in questions)),
            trajectories=trajectories,
        )

    def excess(self, scores: Mapping[str, float | None], *, mode: str) -> tuple[str, float] | None:
        """The region of ``mode`` whose score most exceeds its threshold, as ``(region, score/threshold)``.

        ``None`` when no region of the mode has both a finite score and a threshold.
        """
        best: tuple[str, float] | None = None
        for region in REGIONS_OF_MODE.get(mode, ()):
            score, threshold = scores.get(region), self.thresholds.get(region)
            # A NaN ratio loses every comparison, so it would stay ``best`` and hide the other
            # region's crossing; like ``select_branch_steps``, a non-finite score is no score.
            if score is None or not math.isfinite(score) or not threshold:
                continue
            ratio = score / threshold
            if best is None or ratio > best[1]:
                best = (region, ratio)
        return best

    def to_dict(self) -> dict:
        """The calibration as its file holds it: what it does not record about its origin is left out.

        So a calibration read from a file written before those fields were recorded gives back that
        file's dict (a benchmark's rows that store it still match it).

        Example:
            >>> Calibration("nll", 0.8, {"all": 2.0}, {"all": 60}, model="embedded").to_dict()["model"]
            'embedded'
            >>> "questions" in Calibration("nll", 0.8, {"all": 2.0}, {"all": 60}).to_dict()
            False
        """
        data = asdict(self)
        for name in _PROVENANCE:
            if data[name] is None:
                del data[name]
        if "questions" in data:
            data["questions"] = list(data["questions"])
        return data

    def save(self, path: str | Path) -> Path:
        """Write the calibration as JSON, whole (a crash leaves the old file), and return the path."""
        path = _expanded(path)  # as load() reads it: a "~/" path from Python reaches no shell
        with replacing(path) as tmp:
            tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @staticmethod
    def load(path: str | Path) -> Calibration:
        """Read a calibration file written by :meth:`save` (or ``parallelmuse calibrate``).

        Raises:
            ConfigError: Missing or malformed file.
        """
        if isinstance(path, str) and not path.strip():
            # Path("") is the working directory, reported as "'.' is not a file".
            raise ConfigError(
                f"calibration path {path!r} is blank: give the file `parallelmuse calibrate` wrote, or no calibration"
            )
        # A path typed in Studio's context form or a Python config reaches no shell that would expand ~.
        path = _expanded(path)
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
        # Not mtime alone: a file replaced by one with its old mtime (cp -p, rsync -t, a rewrite
        # within the clock's tick) kept the old thresholds; a replacement changes inode or ctime.
        return _load(str(path.resolve()), stat.st_mtime_ns, stat.st_size, stat.st_ino, stat.st_ctime_ns)


def _expanded(path: str | Path) -> Path:
    """``path`` with a leading ``~`` or ``~user`` expanded.

    ``os.path`` leaves an unknown user's ``~user`` as written, where ``Path.expanduser`` raises
    RuntimeError: the file is then reported not found, not a traceback.
    """
    return Path(os.path.expanduser(path))


@lru_cache(maxsize=16)
def _load(path: str, *version: int) -> Calibration:
    # Keyed by the file's stat: every node of a run resolves the config, the file is read once per change.
    try:
        # utf-8-sig: a file saved again by an editor as "UTF-8 with BOM" (Notepad) was "malformed".
        data = json.loads(Path(path).read_text(encoding="utf-8-sig"))
        cal = Calibration(
            estimator=str(data["estimator"]),
            quantile=float(data["quantile"]),
            thresholds={str(k): float(v) for k, v in data["thresholds"].items()},
            samples={str(k): int(v) for k, v in data.get("samples", {}).items()},
            confidence_floor=None if data.get("confidence_floor") is None else float(data["confidence_floor"]),
            confidence_window=int(data.get("confidence_window", CONFIDENCE_WINDOW)),
            confidence_samples=int(data.get("confidence_samples", 0)),
            model=data.get("model"),  # checked by _problem, as trajectories: str() and int() took anything
            top_logprobs=None if data.get("top_logprobs") is None else int(data["top_logprobs"]),
            questions=None if data.get("questions") is None else _ids(data["questions"]),
            trajectories=data.get("trajectories"),
        )
    # OverflowError: JSON reads Infinity, 1e999 and 400-digit numbers, which int() or float() refuse;
    # RecursionError: nesting deeper than the parser's stack.
    except (ValueError, KeyError, TypeError, AttributeError, OSError, OverflowError, RecursionError) as exc:
        raise ConfigError(
            f"calibration file {path!r} is malformed ({exc}): regenerate it with `parallelmuse calibrate`"
        ) from exc
    if not cal.thresholds:
        raise ConfigError(f"calibration file {path!r} has no thresholds: regenerate it with more trajectories")
    if problem := _problem(cal, data=data):
        raise ConfigError(
            f"calibration file {path!r} is malformed: {problem}; regenerate it with `parallelmuse calibrate`"
        )
    return cal


def _warn_if_few(values: Mapping[str, list[float]], *, trajectories: int, floors: int) -> None:
    """Warn (to the caller of :meth:`Calibration.fit`) when its thresholds or floor come from few samples."""
    # A quantile of 15 trajectories' steps moves a lot from one set of questions to the next.
    few = [f"{region}: {len(vals)} steps" for region, vals in values.items() if 0 < len(vals) < MIN_STEPS]
    if trajectories < MIN_TRAJECTORIES:
        few.append(f"{trajectories} trajectories")
    elif 0 < floors < MIN_TRAJECTORIES:
        few.append(f"confidence floor: {floors} trajectories")
    if few:
        warnings.warn(
            f"calibration thresholds from few samples ({'; '.join(few)}): below {MIN_STEPS} steps per region "
            f"or {MIN_TRAJECTORIES} trajectories they vary a lot with the questions fitted on; calibrate "
            "from more trajectories",
            UserWarning,
            stacklevel=3,
        )


def _ids(value: object) -> tuple[str, ...]:
    # A string is iterable too: "q1" read as the questions "q" and "1".
    if not isinstance(value, list):
        raise TypeError(f"questions must be a list of ids, got {type(value).__name__}")
    return tuple(str(q) for q in value)


def _problem(cal: Calibration, *, data: Mapping[str, object]) -> str | None:
    """What makes a calibration read from a file unusable (``None``: nothing); ``data``: the file as written."""
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
    window = data.get("confidence_window", CONFIDENCE_WINDOW)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        # int() read 2.7 as 2, and a window of 0 divided by zero mid-rollout.
        return f"confidence_window {window!r} must be a whole number of tokens >= 1"
    # str() read null as the estimator 'None' and int() -3 as a count: a run then refused the file with
    # "fitted with estimator='None'" or advised setting top_logprobs=-3, which it would refuse in turn.
    if data["estimator"] not in get_args(Estimator):
        return f"estimator {data['estimator']!r} must be one of {', '.join(map(repr, get_args(Estimator)))}"
    if data.get("top_logprobs") is not None and (problem := top_logprobs_problem(data["top_logprobs"])):
        return problem
    # str() read "model": 3 as the model '3' (a run warned it was fitted on another model), int() read
    # "trajectories": 2.7 as 2 and -3 as a count, and "many" failed naming no field.
    if (model := data.get("model")) is not None and not isinstance(model, str):
        return f"model {model!r} must be the name of the model the runs were scored on, a string"
    trajectories = data.get("trajectories")
    if trajectories is not None and (
        isinstance(trajectories, bool) or not isinstance(trajectories, int) or trajectories < 1
    ):
        return f"trajectories {trajectories!r} must be the whole number of trajectories fitted on, >= 1"
    return None
