"""Validated settings of a ParallelMuse run, also used as the graph's ``context_schema``.

All budget arithmetic is checked here, before any model call, so a bad setting fails fast with a
message that names the setting and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from langgraph_parallelmuse.calibration import Calibration
from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.logprobs import top_logprobs_problem
from langgraph_parallelmuse.uncertainty import REGIONS_OF_MODE, Estimator, Mode

Aggregation = Literal["parallelmuse", "majority", "weighted", "max_tool_calls"]
Branching = Literal["post_hoc", "online"]
DriverName = Literal["auto", "free", "guided"]
ReportForm = Literal["text", "graph"]

#: The most trajectories a question may run (``n``). Each is planned, its job and thread made, before the first
#: model call: ``n=10**9`` (a typo) spent minutes and gigabytes before failing. The paper runs 8, DeepConf 512.
MAX_N = 4096


class ParallelMuseConfig(BaseModel):
    """Settings of the ParallelMuse graph (paper defaults: N=8, M=1, k=2, T=3).

    Pass it to :func:`create_parallelmuse` (``config=``) or per run as LangGraph ``context``;
    LangGraph Studio shows these fields because the class is the graph's ``context_schema``.

    Example:
        >>> from langgraph_parallelmuse import ParallelMuseConfig
        >>> cfg = ParallelMuseConfig(n=4, k=1, t=2)
        >>> cfg.fill_budget
        1
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Stage 1: functionality-specified partial rollout.
    n: int = Field(8, description=f"Total trajectory budget N per question (at most {MAX_N}).")
    m: int = Field(1, description="Initial from-scratch trajectories M.")
    k: int = Field(2, description="Top-k most uncertain steps to branch from, per initial trajectory.")
    t: int = Field(3, description="Branches T launched from each picked step.")
    mode: Mode = Field(
        "exploration",
        description="Which functional region's uncertainty picks branch points; 'none' = from scratch.",
    )
    estimator: Estimator = Field(
        "nll", description="'nll' = paper Eq. 1 perplexity; 'entropy' = top-k entropy (official code)."
    )
    # Beyond the paper (off by default).
    rounds: int = Field(
        1,
        description="Branching rounds. Above 1, the budget left after round 1 goes to branches of the "
        "branches (at their most uncertain regenerated step) instead of from-scratch fills.",
    )
    calibration: str | None = Field(
        None,
        description="Calibration file (`parallelmuse calibrate`): branch at every step whose region "
        "perplexity exceeds the calibrated threshold, most uncertain first, capped by the budget "
        "(post hoc it replaces top-k; online, the first k such steps of each initial trajectory fork).",
    )
    diverse_branches: bool = Field(
        False,
        description="Resample a branch's first step when its tool call repeats the parent's or a "
        "sibling's (same tool, same normalised arguments).",
    )
    branching: Branching = Field(
        "post_hoc",
        description="'post_hoc' (the paper): branch after the initial trajectories finish; 'online': fork a "
        "step as soon as it finishes above the calibrated threshold (at most k per initial trajectory), "
        "while its parent goes on.",
    )
    early_stop: bool = Field(
        False,
        description="Stop a trajectory whose lowest sliding-window confidence falls below the calibration's "
        "floor (DeepConf); it is left out of voting and aggregation. Works with mode='none' too (plain "
        "sampling, as DeepConf), where only the calibration's floor is read.",
    )
    consensus: float | None = Field(
        None,
        description="Stop sampling once this share of at least 3 finished answers agree (online branching): "
        "no more trajectories start and running ones are cancelled.",
    )
    # Sampling.
    temperature: float = Field(0.6, description="Rollout sampling temperature.")
    top_p: float = Field(0.95, description="Rollout nucleus sampling.")
    top_logprobs: int = Field(16, description="Top logprobs requested per token (entropy uses them).")
    seed: int | None = Field(None, description="Base seed; each trajectory derives its own.")
    # Per-trajectory limits.
    max_turns: int = Field(
        10,
        description="Maximum think steps per trajectory (the last one must answer). The guided driver "
        "plans fewer for most questions (GuidedDriver.turns: 6, two more for each entity nested in the question "
        "beyond the first).",
    )
    max_step_tokens: int = Field(256, description="Maximum generated tokens per think step.")
    max_context_tokens: int = Field(8192, description="Prompt budget; when exceeded the agent is forced to answer.")
    max_observation_chars: int = Field(1200, description="Tool output longer than this is truncated.")
    tool_timeout: float = Field(
        30.0,
        description="Seconds before a tool call is abandoned (the agent gets an error; a sync tool's thread "
        "cannot be stopped and runs on).",
    )
    driver: DriverName = Field(
        "auto",
        description="'free' = model writes whole steps; 'guided' = tags prefilled (small local models).",
    )
    # Stage 2: compressed reasoning aggregation.
    aggregation: Aggregation = Field("parallelmuse", description="How the final answer is chosen.")
    max_report_tokens: int = Field(
        256,
        description="Maximum tokens the model generates for one compressed report (the guided and graph forms "
        "write their facts from the trajectory's records, outside this bound).",
    )
    max_aggregate_tokens: int = Field(
        1024,
        description="Maximum tokens of the aggregator's reply in the free form, where a capable model may reason "
        "before its <answer> (a reply cut off there has no answer and the majority vote stands in); the guided "
        "pick is one line of at most 64 tokens.",
    )
    # Beyond the paper: the information-state graph (off by default).
    report_form: ReportForm = Field(
        "text",
        description="'text' = the three-section report; 'graph' = the trajectory's effective subgraph (entities, "
        "relations with the tool call of each, sub-answers) and one model-written reasoning line.",
    )
    crossover: int = Field(
        0,
        description="Crossover trajectories inside N: after the reports, each answers from the merged effective "
        "evidence of two trajectories (the best-supported that disagree, else two with different evidence); the "
        "rollout stage runs N - crossover trajectories.",
    )
    max_concurrency: int = Field(8, description="Trajectories or reports in flight at once.")

    @model_validator(mode="before")
    @classmethod
    def _no_truth_values_for_numbers(cls, data: object) -> object:
        # pydantic reads True as 1 and False as 0: n=True would run one trajectory. numpy's bool
        # (a comparison's result, ``n=counts.any()``) is no bool subclass, and pydantic reads it so too.
        if isinstance(data, dict):
            numeric = (int, float, int | None, float | None)
            given = [k for k, v in data.items() if _truth_value(v) and k in cls.model_fields]
            if wrong := [k for k in given if cls.model_fields[k].annotation in numeric]:
                raise ValueError(f"{', '.join(f'{k}={data[k]}' for k in wrong)}: give a number, not true/false")
        return data

    @model_validator(mode="after")
    def _check_budget(self) -> ParallelMuseConfig:
        problems = []
        if self.n < 1:
            problems.append(f"n={self.n}: the budget N must be at least 1")
        elif self.n > MAX_N:
            problems.append(f"n={self.n}: at most {MAX_N} trajectories per question (the paper runs 8)")
        if self.m < 1:
            problems.append(f"m={self.m}: need at least one initial trajectory (M >= 1)")
        if self.k < 0:
            problems.append(f"k={self.k}: k is a count of steps, use 0 or more")
        if self.t < 1:
            problems.append(f"t={self.t}: T (branches per pick) must be at least 1")
        n = f"n={self.n}" if not self.crossover else f"n - crossover = {self.rollout_n}"
        if self.m > self.rollout_n:
            problems.append(f"m={self.m} > {n}: initial trajectories cannot exceed N")
        elif self.mode != "none" and self._top_k and self.m + self.m * self.k * self.t > self.rollout_n:
            problems.append(f"{n} < m + m*k*t = {self.m + self.m * self.k * self.t}: raise n or lower k/t")
        elif self.mode != "none" and not self._top_k and self.m + self.t > self.rollout_n:
            problems.append(f"{n} < m + t = {self.m + self.t}: no room for one calibrated pick's branches")
        problems += self._online_problems() + self._crossover_problems()
        if self.rounds < 1:
            problems.append(f"rounds={self.rounds}: use 1 (the paper) or more")
        problems += self._unbranched_problems()
        if self.calibration is not None:
            problems += self._calibration_problems()
        # The reports pass the seed to the model as it is, and the in-process engine (as numpy's generator,
        # which the bench's intervals draw from) takes none below 0: the run failed after its rollouts.
        if self.seed is not None and not 0 <= self.seed < 2**64:
            problems.append(f"seed={self.seed}: use a whole number in [0, 2**64), or no seed")
        if not 0.0 <= self.temperature <= 2.0:
            problems.append(f"temperature={self.temperature}: use a value in [0, 2]")
        if not 0.0 < self.top_p <= 1.0:
            problems.append(f"top_p={self.top_p}: use a value in (0, 1]")
        if (problem := top_logprobs_problem(self.top_logprobs)) is not None:
            problems.append(problem)
        if self.estimator == "entropy" and self.mode != "none" and self.top_logprobs < 2:
            problems.append("estimator='entropy' needs top_logprobs >= 2 (16 in the paper)")
        if self.max_turns < 1:
            problems.append(f"max_turns={self.max_turns}: a trajectory needs at least 1 turn")
        for name in (
            "max_step_tokens",
            "max_context_tokens",
            "max_report_tokens",
            "max_aggregate_tokens",
            "max_concurrency",
            "max_observation_chars",
        ):
            if getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)}: must be positive")
        if not self.tool_timeout > 0:  # NaN fails this too
            problems.append(f"tool_timeout={self.tool_timeout}: must be positive seconds")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _online_problems(self) -> list[str]:
        problems = []
        if self.branching == "online" and (self.mode == "none" or self.rounds > 1):
            problems.append("branching='online' forks the initial trajectories once: use a branching mode and rounds=1")
        if self.consensus is not None and (self.branching != "online" or not 0.5 < self.consensus <= 1.0):
            problems.append(f"consensus={self.consensus}: a share in (0.5, 1], with branching='online'")
        if self.early_stop:
            floor = None
            if self.calibration is not None:
                try:
                    floor = Calibration.load(self.calibration).confidence_floor
                except ConfigError:
                    # Reported with the calibration's other problems: its floor is unknown, not missing.
                    return problems
            if floor is None:
                problems.append(
                    "early_stop needs calibration= a file with a confidence floor (`parallelmuse calibrate` on "
                    "runs of other questions)"
                )
        return problems

    def _unbranched_problems(self) -> list[str]:
        """Settings that mode 'none' (from-scratch sampling) would silently ignore: each message names
        a way out that validates (DeepConf's early stop reads only the calibration's floor, so it runs
        without branching)."""
        if self.mode != "none":
            return []
        problems = []
        if self.rounds > 1:
            problems.append(
                f"rounds={self.rounds}: rounds after the first branch the branches, so they need a branching mode "
                "(mode='none' makes none): set mode (e.g. 'exploration') or rounds=1"
            )
        if self.calibration is not None and not self.early_stop:
            problems.append(
                "calibration: mode='none' picks no branch points, so only early_stop reads the calibration (its "
                "confidence floor): set early_stop=True, a branching mode (e.g. mode='exploration'), or no calibration"
            )
        return problems

    def _calibration_problems(self) -> list[str]:
        try:
            cal = Calibration.load(self.calibration)
        except ConfigError as exc:
            return [f"calibration: {exc}"]
        problems = []
        # With mode 'none' only early_stop reads the file: its thresholds and estimator are unused.
        branching = self.mode != "none"
        if branching and cal.estimator != self.estimator:
            problems.append(
                f"calibration was fitted with estimator={cal.estimator!r} but estimator={self.estimator!r}:"
                " use the same estimator or recalibrate"
            )
        if branching and not any(r in cal.thresholds for r in REGIONS_OF_MODE[self.mode]):
            problems.append(f"calibration has no threshold for mode {self.mode!r}: recalibrate")
        # The entropy estimator's thresholds and DeepConf's floor are read from the top logprobs, so
        # they move with how many there are (the same tokens' entropy PPL: 1.81 from 16, 1.15 from 2).
        # The nll estimator reads the sampled token's logprob alone: without early_stop any count fits.
        # A file that did not record its count (written before it did) cannot be checked.
        uses = [
            use
            for use, on in (
                ("estimator='entropy'", branching and self.estimator == "entropy"),
                ("early_stop", self.early_stop),
            )
            if on
        ]
        if uses and cal.top_logprobs is not None and cal.top_logprobs != self.top_logprobs:
            problems.append(
                f"calibration was fitted with top_logprobs={cal.top_logprobs} but top_logprobs={self.top_logprobs}, "
                f"which {' and '.join(uses)} read: set top_logprobs={cal.top_logprobs} or recalibrate with "
                f"top_logprobs={self.top_logprobs}"
            )
        return problems

    def _crossover_problems(self) -> list[str]:
        if self.crossover < 0:
            return [f"crossover={self.crossover}: a count of trajectories, use 0 (off) or more"]
        if self.crossover and self.aggregation != "parallelmuse":
            return [f"crossover needs the reports: aggregation={self.aggregation!r} writes none, use 'parallelmuse'"]
        return []

    @property
    def rollout_n(self) -> int:
        """Trajectories of the rollout stage: N less the crossover trajectories that follow the reports.

        Example:
            >>> ParallelMuseConfig(crossover=1).rollout_n
            7
        """
        return self.n - self.crossover

    @property
    def branch_budget(self) -> int:
        """Most branches the first round can launch: M*k*T (the paper, and online forking), as many
        whole groups of T as fit in N - M with a post-hoc calibration, 0 for mode 'none'."""
        if self.mode == "none":
            return 0
        if not self._top_k:
            return (self.rollout_n - self.m) // self.t * self.t
        return self.m * self.k * self.t

    @property
    def _top_k(self) -> bool:
        """At most k branch points per initial trajectory: the paper's top-k, and online forking (its
        first k steps over the threshold); a post-hoc calibration branches at every step over it."""
        return self.calibration is None or self.branching == "online"

    @property
    def fill_budget(self) -> int:
        """From-scratch trajectories launched beside the initial ones (they need no uncertainty).

        With ``rounds > 1`` the leftover budget is kept for later rounds instead.
        """
        return 0 if self.rounds > 1 else self.rollout_n - self.m - self.branch_budget


def _truth_value(value: object) -> bool:
    """Whether ``value`` is a bool, Python's or an array library's (numpy's ``bool_``: its dtype kind ``b``)."""
    return isinstance(value, bool) or getattr(getattr(value, "dtype", None), "kind", None) == "b"


def _problems(exc: ValidationError) -> str:
    msgs = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "config"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            # "Extra inputs are not permitted" alone said neither that the name is unknown nor which one was meant.
            msg += f": no such setting{_nearest(str(err['loc'][-1]))}"
        msgs.append(msg if not err["loc"] else f"{loc}: {msg}")
    return "; ".join(msgs)


def _nearest(name: str) -> str:
    """`` (did you mean 'x'?)`` for the setting ``name`` is a near miss of (``N``, ``max-turns``), else ``""``.

    Example:
        >>> _nearest("Max-Turns"), _nearest("temprature"), _nearest("user_id")
        (" (did you mean 'max_turns'?)", " (did you mean 'temperature'?)", '')
    """
    key = name.strip().lower().replace("-", "_").replace(" ", "_")
    near = difflib.get_close_matches(key, ParallelMuseConfig.model_fields, n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


def make_config(config: ParallelMuseConfig | dict | None = None, /, **overrides) -> ParallelMuseConfig:
    """Build a validated config, raising :class:`ConfigError` with every problem named.

    Raises:
        ConfigError: ``config`` is neither a mapping nor a :class:`ParallelMuseConfig`, or the
            settings are invalid.

    Example:
        >>> make_config({"n": 8}, k=1).k
        1
    """
    if isinstance(config, ParallelMuseConfig):
        data = config.model_dump()
    elif config is None or isinstance(config, Mapping):
        data = dict(config or {})
    else:
        raise ConfigError(
            f"config={config!r:.80} ({type(config).__name__}): pass a dict of settings (e.g. {{'n': 8}}) "
            "or a ParallelMuseConfig"
        )
    data.update(overrides)
    try:
        return ParallelMuseConfig(**data)
    except ValidationError as exc:
        unknown = any(err["type"] == "extra_forbidden" for err in exc.errors())
        known = f" (settings: {', '.join(ParallelMuseConfig.model_fields)})" if unknown else ""
        raise ConfigError("invalid ParallelMuse config: " + _problems(exc) + known) from None


class _Context(BaseModel):
    """LangGraph builds the context with ``context_schema(**context)``: name the bad field, as ConfigError."""

    model_config = ConfigDict(extra="forbid")

    def __init__(self, **data: object) -> None:
        # Every field here takes None, so pydantic would read n=True as 1 before the config's own
        # check could see it: checked against the config's field types first.
        try:
            ParallelMuseConfig._no_truth_values_for_numbers(data)
            super().__init__(**data)
        except (ValidationError, ValueError) as exc:
            problems = _problems(exc) if isinstance(exc, ValidationError) else str(exc)
            raise ConfigError(
                "invalid context: " + problems + f" (fields: {', '.join(ParallelMuseConfig.model_fields)})"
            ) from None


def _context_model() -> type[BaseModel]:
    fields = {
        name: (field.annotation | None, Field(None, description=field.description))
        for name, field in ParallelMuseConfig.model_fields.items()
    }
    model = create_model("ParallelMuseContext", __base__=_Context, **fields)
    model.__doc__ = (
        "Per-run overrides of :class:`ParallelMuseConfig` (the graph's ``context_schema``).\n\n"
        "Every field is optional; the ones given replace the graph's configured values and the "
        "merged result is validated as a whole, so ``context={'n': 4, 'k': 1}`` works on top of "
        "any factory config."
    )
    return model


ParallelMuseContext = _context_model()


#: The entry of a parent graph's context that holds ParallelMuse's settings alone (see :func:`context_overrides`).
CONTEXT_ENTRY = "parallelmuse"


def context_overrides(context: object) -> dict[str, object]:
    """The settings a run's context sets explicitly (a full config sets them all).

    As a node of another graph, the graph runs under that graph's context (a dict, a dataclass, a
    model of its own): only the fields named like ours are read from it, and a ``None`` where our
    setting cannot be ``None`` counts as unset. When that context has an entry named
    :data:`CONTEXT_ENTRY` (``parallelmuse``: a key, an attribute, a dataclass field), only that entry
    is read, as a dict of settings, a :class:`ParallelMuseConfig` or a :data:`ParallelMuseContext`
    (``None``: no settings), and the app's own fields stay its own, even those named like ours. At
    the top level LangGraph builds a :data:`ParallelMuseContext`, which refuses unknown fields.

    Raises:
        ConfigError: The context carries no named settings, or its ``parallelmuse`` entry is not
            one of the above or names an unknown setting.

    Example:
        >>> context_overrides(ParallelMuseContext(n=4))
        {'n': 4}
        >>> context_overrides({"user_id": "u1", "temperature": 0.2})
        {'temperature': 0.2}
        >>> context_overrides({"temperature": None, "seed": None})  # the parent's unset temperature
        {'seed': None}
        >>> context_overrides({"k": 4, "temperature": 0.0, "parallelmuse": {"n": 4, "k": 1}})  # the app's k stays
        {'n': 4, 'k': 1}
    """
    context, _ = _own_context(context)
    if context is None:
        return {}
    if isinstance(context, ParallelMuseConfig):
        return context.model_dump()
    if isinstance(context, _Context):  # its schema shows every field nullable: {"n": None} is unset
        # In the fields' order: the set of those given has none.
        values = {k: getattr(context, k) for k in type(context).model_fields if k in context.model_fields_set}
    else:
        values = _fields(context)
    # A None where a setting cannot be None is "unset": a parent's own field named like a setting and
    # left None is not one of ours (read as ours, every run of the parent app would fail validation).
    return {
        k: v for k, v in values.items() if k in ParallelMuseConfig.model_fields and (v is not None or _takes_none(k))
    }


def _own_context(context: object) -> tuple[object, bool]:
    """The context our settings are read from, and whether it is a parent's own (read by same-named fields).

    A parent's ``parallelmuse`` entry stands for the whole context: a dict there is read strictly
    (an unknown name is a typo, not the app's own field), and ``None`` sets nothing.
    """
    if context is None or isinstance(context, ParallelMuseConfig | _Context):
        return context, False
    if isinstance(context, Mapping):
        found, entry = CONTEXT_ENTRY in context, context.get(CONTEXT_ENTRY)
    else:
        found, entry = hasattr(context, CONTEXT_ENTRY), getattr(context, CONTEXT_ENTRY, None)
    if not found:
        return context, True
    if isinstance(entry, Mapping):
        try:
            return ParallelMuseContext(**entry), False
        except ConfigError as exc:
            raise ConfigError(f"context[{CONTEXT_ENTRY!r}]: {exc}") from None
    if entry is None or isinstance(entry, ParallelMuseConfig | _Context):
        return entry, False
    raise ConfigError(
        f"context[{CONTEXT_ENTRY!r}] is of type {type(entry).__name__}: give a dict of ParallelMuse's settings "
        "(e.g. {'n': 4, 'k': 1}), a ParallelMuseConfig or a ParallelMuseContext"
    )


def _fields(context: object) -> Mapping[str, object]:
    """The named values of a context that is not ours: a mapping's items, an object's attributes."""
    if isinstance(context, Mapping):
        return context
    if dataclasses.is_dataclass(context):  # slotted dataclasses have no __dict__
        return {f.name: getattr(context, f.name) for f in dataclasses.fields(context)}
    if hasattr(context, "_asdict"):  # a NamedTuple
        return context._asdict()
    if hasattr(context, "__dict__") and not isinstance(context, type):
        return vars(context)
    if slots := [n for c in type(context).__mro__ for n in getattr(c, "__slots__", ()) if hasattr(context, n)]:
        return {n: getattr(context, n) for n in slots}  # attrs' @define, hand-written __slots__
    # A string, a list or a number carries no named settings: read as none, the run would
    # silently use the defaults.
    raise ConfigError(
        f"context must be a mapping of settings or an object with them as attributes, got "
        f"{type(context).__name__}: pass e.g. context={{'n': 4, 'k': 1}}"
    )


def _takes_none(name: str) -> bool:
    return type(None) in typing.get_args(ParallelMuseConfig.model_fields[name].annotation)


def misplaced_settings(configurable: Mapping[str, Any] | None, context: object) -> dict[str, Any]:
    """Settings a caller put in ``config["configurable"]``, where the graph does not read them.

    The graph reads its settings from the factory config and the run's ``context`` (its
    ``context_schema``); LangGraph passes ``configurable`` through untouched, so ``n=4`` there would
    silently run with the default budget. A key the context also sets is not reported: the context's
    value is the one used.

    Example:
        >>> misplaced_settings({"thread_id": "t1", "n": 4, "user_id": "u1"}, None)
        {'n': 4}
        >>> misplaced_settings({"n": 4}, {"n": 4})
        {}
        >>> misplaced_settings({"temperature": None}, {"temperature": None})  # a mirrored unset field
        {}
        >>> misplaced_settings({"k": 4, "n": 4}, {"k": 4, "parallelmuse": {}})  # the app's own k, mirrored
        {'n': 4}
    """
    given = context_overrides(context) if context is not None else {}
    # langgraph-api copies a run's context into configurable: a parent's own field there (its k beside
    # its parallelmuse entry) is the app's, and a None is nobody's setting (a parent's unset field).
    own, _ = _own_context(context)
    theirs = _fields(context) if own is not context else {}  # read from its entry: the rest is the app's
    return {
        k: v
        for k, v in (configurable or {}).items()
        if k in ParallelMuseConfig.model_fields and k not in given and k not in theirs and v is not None
    }


def resolve_config(base: ParallelMuseConfig, context: object) -> ParallelMuseConfig:
    """The settings of one run: the factory config with the run's context overrides applied.

    Example:
        >>> base = ParallelMuseConfig(max_turns=3)
        >>> resolve_config(base, {"n": 4, "k": 1}).max_turns
        3
    """
    if isinstance(context, ParallelMuseConfig):
        return context
    overrides = context_overrides(context)
    if not overrides:
        return base
    try:
        return make_config(base, **overrides)
    except ConfigError as exc:
        if not _own_context(context)[1]:
            raise
        # A parent app's own field that happens to share a setting's name: say how to keep it out.
        names = ", ".join(repr(k) for k in overrides)
        field = "field" if len(overrides) == 1 else "fields"
        raise ConfigError(
            f"{exc} (read from the parent graph's context {field} {names}; put ParallelMuse's settings under "
            f"context[{CONTEXT_ENTRY!r}] to keep the app's own {names} out)"
        ) from None
