"""The typed contract between the portal and this Flower App (imports no Django and no flwr).

Three kinds of message cross the boundary, and each is parsed here — types, ranges, finiteness,
sizes — before anyone acts on it:

1. **Run config** (:class:`RunConfig`, portal → every SuperNode and the ServerApp): the keys of
   ``[tool.flwr.app.config]`` in this app's ``pyproject.toml`` (a test ties the two). Flower sends it
   to every SuperNode and stores it in the SuperLink's database, so it carries no secret: the
   ServerApp's callback key comes from its own host's environment (``frp_flwr.signing``).
2. **Callback events** (ServerApp → portal, JSON): ``{"event": <name>, "seq": <n>, …fields}`` with one
   dataclass per event (:class:`Started`, :class:`Round`, :class:`Finished`, :class:`Contribution`,
   :class:`Failed`) and the portal's answer :class:`CallbackAnswer`. ``seq`` numbers a run's events
   1, 2, 3 …; the portal accepts each number once and only above the last one it accepted.
3. **Site replies** (ClientApp → ServerApp metric records, shaped as :data:`MESSAGES_VERSION`
   says): :class:`SiteInfo`, :class:`TrainReply`, :class:`EvaluateReply`, :class:`CoalitionReply`, and the preparation and evaluation records
   sent as JSON (:class:`SiteSummary`, :class:`SiteQuantiles`, :class:`DesignStats`,
   :class:`EvalReport`). A site could send anything,
   so the ServerApp parses each reply and treats one that does not fit as that site's error.

Every parser raises :class:`ContractError` naming the field (``sites.hospital-a.eval_accuracy: …``);
nothing non-finite gets through (no NaN or infinity reaches a database).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

# ---------------------------------------------------------------------------------------------
# Limits
# ---------------------------------------------------------------------------------------------

#: Largest callback body the portal reads (bytes).
MAX_EVENT_BYTES = 2 * 1024 * 1024  # below Django's DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB)
#: Most sites a job may have (entries in any per-site map).
MAX_SITES = 256
#: Most rounds a job may run (the portal's ``FederatedJob.num_rounds`` range is 1..100).
MAX_ROUNDS = 100
#: Longest free text (an error or a reason), characters; longer text is an error, not cut.
MAX_TEXT = 4000
#: Most numbers in a final model (all layers).
MAX_MODEL_VALUES = 100_000
#: Most numbers a job's model may have: its final model travels in the ``finished`` event, whose
#: body is at most ``MAX_EVENT_BYTES``; a float takes at most 24 characters of JSON and a comma,
#: so 80,000 of them leave about 95 kB for the rest of the event. The portal refuses a larger
#: model at submission (it would train every round, then fail to report).
MAX_FINAL_MODEL_VALUES = 80_000
#: Most coalition utilities in a contribution event (all rounds).
MAX_UTILITIES = 20_000
#: Largest count (examples, bytes): a signed 64-bit integer.
MAX_COUNT = 2**63 - 1
#: Largest duration, seconds (about 31 years).
MAX_SECONDS = 1e9
#: Largest event sequence number (exact in a JSON double).
MAX_SEQ = 2**53

_SITE_RE = re.compile(r"^[-a-zA-Z0-9_]{1,50}$")  # a Django SlugField of max_length 50
_NODE_RE = re.compile(r"^[0-9]{1,20}$")  # Flower node ids are uint64
_NODE_OR_EMPTY_RE = re.compile(r"^[0-9]{0,20}$")
_COALITION_RE = re.compile(r"^(?:[0-9]{1,4}(?:,[0-9]{1,4})*)?$")


class ContractError(ValueError):
    """A run config, event, answer or site reply does not fit the contract; says which field."""


# ---------------------------------------------------------------------------------------------
# Field readers (each names the field in its error)
# ---------------------------------------------------------------------------------------------


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def read_int(value: Any, where: str, *, lo: int = 0, hi: int = MAX_COUNT) -> int:
    """An integer (not a bool) in ``lo..hi``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ContractError(f"{where}: expected an integer, got {_kind(value)}")
    if not lo <= value <= hi:
        raise ContractError(f"{where}: {value} is outside {lo}..{hi}")
    return value


def read_float(value: Any, where: str, *, lo: float = -math.inf, hi: float = math.inf) -> float:
    """A finite number (int or float, not a bool) in ``lo..hi``, as float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ContractError(f"{where}: expected a number, got {_kind(value)}")
    try:
        number = float(value)
    except OverflowError:
        raise ContractError(f"{where}: the number is too large") from None
    if not math.isfinite(number):
        raise ContractError(f"{where}: {number} is not a finite number")
    if not lo <= number <= hi:
        raise ContractError(f"{where}: {number} is outside {lo}..{hi}")
    return number


def read_opt_float(value: Any, where: str, **bounds) -> float | None:
    """``None`` or :func:`read_float`."""
    return None if value is None else read_float(value, where, **bounds)


def read_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ContractError(f"{where}: expected true or false, got {_kind(value)}")
    return value


def read_str(value: Any, where: str, *, max_len: int = MAX_TEXT, pattern=None) -> str:
    """A string of at most ``max_len`` characters (matching ``pattern`` when given)."""
    if not isinstance(value, str):
        raise ContractError(f"{where}: expected a string, got {_kind(value)}")
    if len(value) > max_len:
        raise ContractError(f"{where}: longer than {max_len} characters")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate from a JSON escape such as "\ud800"
            raise ContractError(f"{where}: not valid Unicode text") from None
    if pattern is not None and not pattern.match(value):
        raise ContractError(f"{where}: {value[:60]!r} is not a valid value")
    return value


def read_site(value: Any, where: str) -> str:
    """A site id (the slug a SuperNode reports)."""
    return read_str(value, where, max_len=50, pattern=_SITE_RE)


def read_map(value: Any, where: str, *, max_items: int = MAX_SITES) -> dict:
    """A JSON object of at most ``max_items`` entries."""
    if not isinstance(value, dict):
        raise ContractError(f"{where}: expected an object, got {_kind(value)}")
    if len(value) > max_items:
        raise ContractError(f"{where}: more than {max_items} entries")
    return value


def read_list(value: Any, where: str, *, max_items: int) -> list:
    """A JSON array of at most ``max_items`` items."""
    if not isinstance(value, list | tuple):
        raise ContractError(f"{where}: expected a list, got {_kind(value)}")
    if len(value) > max_items:
        raise ContractError(f"{where}: more than {max_items} items")
    return list(value)


def read_site_map(value: Any, where: str, item) -> dict:
    """``{site id: item(value, where)}``."""
    return {
        read_site(k, f"{where} key"): item(v, f"{where}.{k}")
        for k, v in read_map(value, where).items()
    }


def _finite_or_none(value: float | None) -> float | None:
    """For senders: a value that may be NaN (a mean over nothing) as ``None``."""
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


finite_or_none = _finite_or_none


def _read_fields(cls, raw: Mapping, where: str, readers: Mapping[str, Any], *, skip=()) -> dict:
    """Read ``raw`` into keyword arguments of ``cls``: every key known, defaults for absent ones."""
    raw = read_map(raw, where or "body", max_items=64)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(raw) - known - set(skip))
    if unknown:
        raise ContractError(f"{where or 'body'}: unknown field(s) {', '.join(map(repr, unknown))}")
    out = {}
    for name, reader in readers.items():
        if name in raw:
            out[name] = reader(raw[name], f"{where}.{name}" if where else name)
    required = [
        f.name
        for f in fields(cls)
        if f.name not in out and f.default is MISSING and f.default_factory is MISSING
    ]
    if required:
        raise ContractError(f"{where or 'body'}: missing field(s) {', '.join(required)}")
    return out


def _json_value(value):
    if isinstance(value, Mapping):
        return {k: _json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if hasattr(value, "to_json"):
        return value.to_json()
    return value


class _Record:
    """Mixin: ``to_json`` of a dataclass whose fields are JSON values or other records."""

    def to_json(self) -> dict:
        return {f.name: _json_value(getattr(self, f.name)) for f in fields(self)}


# ---------------------------------------------------------------------------------------------
# 1. Run config
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SitePointer(_Record):
    """Where a site finds the dataset version a job trains on (within the site's own store)."""

    store_key: str
    dataset: str
    version: int

    @classmethod
    def from_json(cls, raw: Any, where: str = "") -> SitePointer:
        return cls(
            **_read_fields(
                cls,
                raw,
                where,
                {
                    "store_key": lambda v, w: read_str(v, w, max_len=500),
                    "dataset": read_site,
                    "version": lambda v, w: read_int(v, w, lo=1, hi=2**31 - 1),
                },
            )
        )


#: How a feature is encoded: ``numeric`` (as is), ``categorical`` (one-hot over the federated
#: vocabulary), ``date`` (days since 1970-01-01, then as a number).
FEATURE_KINDS = ("numeric", "categorical", "date")
#: What is done with a feature's missing cells: drop the row, or impute from federated statistics.
MISSING_RULES = ("drop", "mean", "median", "most_frequent")
#: The rules each kind allows (the first is the portal's default for that kind).
RULES_FOR_KIND = {
    "numeric": ("median", "mean", "drop"),
    "date": ("median", "mean", "drop"),
    "categorical": ("most_frequent", "drop"),
}
#: The tasks; the target's type decides (float → regression, else classification).
TASKS = ("classification", "regression")
#: The profile's small-count threshold (``sandbox.profile.SMALL_COUNT``): a category held by at
#: most this many rows at a site is merged into "other" there, and never named.
SMALL_COUNT = 7
#: The profile's rounding base (``sandbox.profile.ROUNDING_BASE``).
ROUNDING_BASE = 5
#: What a suppressed count ("≤7") stands for in figures computed from released counts
#: (``sandbox.profile.SUPPRESSED_STANDS_FOR``, ADR 0036).
SUPPRESSED_STANDS_FOR = 4


def about(n: int) -> str:
    """A count as the profile's rule shows it to researchers (``sandbox.profile.safe_count``):
    ``"0"``, ``"≤7"`` for 1–7, else ``"≈"`` the nearest multiple of 5 (``196 → "≈195"``). Reasons
    that reach the job page (every project member reads them) name a site's counts this way:
    its exact rows are for its own stewards (issue 9, finding 5)."""
    if n <= 0:
        return str(n)
    if n <= SMALL_COUNT:
        return f"≤{SMALL_COUNT}"
    return f"≈{(n + ROUNDING_BASE // 2) // ROUNDING_BASE * ROUNDING_BASE}"


def released(n: int) -> int:
    """A count as released to researchers, as a number (``sandbox.profile.released_count``, the
    rule of ADR 0036): ``0`` for 0, ``SUPPRESSED_STANDS_FOR`` (4) for 1–7, else the nearest
    multiple of 5 (``157 → 155``). A ratio or sum of released counts tells nothing the released
    counts do not; the ServerApp fits its count-type statistics from them (``frp_flwr.preprocess``,
    issue 9, finding 5). Raises ``ValueError`` for a negative ``n``."""
    if n < 0:
        raise ValueError(f"a count cannot be negative: {n}")
    if n == 0:
        return 0
    if n <= SMALL_COUNT:
        return SUPPRESSED_STANDS_FOR
    return (n + ROUNDING_BASE // 2) // ROUNDING_BASE * ROUNDING_BASE


def released_floor(n: int) -> int:
    """The smallest count that is released as :func:`released` releases ``n``
    (``sandbox.profile.released_floor``): ``0`` for 0, ``1`` for 1–7, else the released figure
    less 2 (``"≈115"`` is any of 113–117). A function of the released count alone; a fraction
    over ``n`` rows snapped to a grid of ``1 / released_floor(n)`` holds for every count the
    released one allows (ADR 0036, amendment). Raises ``ValueError`` for a negative ``n``."""
    shown = released(n)
    if shown == 0:
        return 0
    if n <= SMALL_COUNT:
        return 1
    return max(shown - ROUNDING_BASE // 2, 0)


@dataclass(frozen=True)
class FeaturePlan(_Record):
    """How one feature enters the model: its ``kind`` (``FEATURE_KINDS``), its ``missing`` rule
    (``RULES_FOR_KIND[kind]``) and whether a 0/1 missing-indicator column is added."""

    name: str
    kind: str = "numeric"
    missing: str = "median"
    indicator: bool = False

    @classmethod
    def from_json(cls, raw: Any, where: str = "") -> FeaturePlan:
        plan = cls(
            **_read_fields(
                cls,
                raw,
                where,
                {
                    "name": lambda v, w: read_str(v, w, max_len=200),
                    "kind": lambda v, w: _choice(v, w, FEATURE_KINDS),
                    "missing": lambda v, w: _choice(v, w, MISSING_RULES),
                    "indicator": read_bool,
                },
            )
        )
        if plan.missing not in RULES_FOR_KIND[plan.kind]:
            raise ContractError(
                f"{where}.missing: {plan.missing!r} does not apply to a {plan.kind} feature "
                f"(use one of {', '.join(RULES_FOR_KIND[plan.kind])})"
            )
        return plan


def read_model_choice(value: Any, where: str = "model") -> dict:
    """A job's ``model`` object, complete (``frp_flwr.models.read_model_spec``). Raises
    ``ContractError`` naming the field."""
    from frp_flwr.choices import ModelSpecError, read_model_spec

    try:
        return read_model_spec(value, where)
    except ModelSpecError as exc:
        raise ContractError(str(exc)) from None


def read_strategy_choice(value: Any, where: str = "strategy") -> dict:
    """A job's ``strategy`` object, complete (``frp_flwr.strategies.read_strategy_spec``).
    Raises ``ContractError`` naming the field."""
    from frp_flwr.choices import StrategySpecError, read_strategy_spec

    try:
        return read_strategy_spec(value, where)
    except StrategySpecError as exc:
        raise ContractError(str(exc)) from None


def _choice(value: Any, where: str, choices) -> str:
    text = read_str(value, where, max_len=40)
    if text not in choices:
        raise ContractError(f"{where}: {text[:40]!r} is not one of {', '.join(choices)}")
    return text


#: Differential privacy modes (``Privacy.dp``): none, Flower's server-side fixed clipping, or
#: client-side fixed clipping (the sites clip with ``fixedclipping_mod``; the server adds noise).
DP_MODES = ("off", "server", "client")


@dataclass(frozen=True)
class Privacy(_Record):
    """A job's privacy protections (``job-spec.privacy``); absent in older specs: dp ``off``.

    ``dp``: one of ``DP_MODES``. With dp on, every round's aggregate gets Gaussian noise of
    standard deviation ``noise_multiplier * clipping_norm / n`` (n: sites aggregated) after each
    site's model update (the change from the round's global weights, L2 norm over all arrays)
    is clipped to ``clipping_norm`` (Flower's fixed-clipping wrappers; McMahan et al. 2018,
    arXiv:1710.06963). ``delta``: the δ at which the portal states ε (0 < δ < 1).

    ``secagg``: secure aggregation (SecAgg+, ``frp_flwr.secagg``), with ``secagg_num_shares``
    (the shares of each site's secrets; 0: one per site of the round, otherwise 3 or more) and
    ``secagg_threshold`` (how many rebuild them; 0: two thirds of the shares, otherwise 2 or
    more, fewer than the shares); checked against the job's sites by :func:`_check_secagg`.

    Raises ``ContractError`` for values out of range, dp on without a positive noise
    multiplier and clipping norm, SecAgg+ settings without ``secagg``, or dp with ``secagg``
    (Flower's clipping wrappers need each site's update; with SecAgg+ the server has only the
    sum).
    """

    dp: str = "off"
    noise_multiplier: float = 0.0
    clipping_norm: float = 0.0
    delta: float = 1e-5
    secagg: bool = False
    secagg_num_shares: int = 0
    secagg_threshold: int = 0

    @classmethod
    def from_json(cls, raw: Any, where: str = "privacy") -> Privacy:
        value = cls(
            **_read_fields(
                cls,
                raw,
                where,
                {
                    "dp": lambda v, w: _choice(v, w, DP_MODES),
                    "noise_multiplier": lambda v, w: read_float(v, w, lo=0.0, hi=1e6),
                    "clipping_norm": lambda v, w: read_float(v, w, lo=0.0, hi=1e6),
                    "delta": lambda v, w: read_float(v, w, lo=1e-300, hi=1 - 1e-12),
                    "secagg": read_bool,
                    "secagg_num_shares": lambda v, w: read_int(v, w, lo=0, hi=MAX_SITES),
                    "secagg_threshold": lambda v, w: read_int(v, w, lo=0, hi=MAX_SITES),
                },
            )
        )
        if value.dp != "off" and value.noise_multiplier <= 0:
            raise ContractError(f"{where}.noise_multiplier: must be above 0 with dp {value.dp!r}")
        if value.dp != "off" and value.clipping_norm <= 0:
            raise ContractError(f"{where}.clipping_norm: must be above 0 with dp {value.dp!r}")
        if not value.secagg and (value.secagg_num_shares or value.secagg_threshold):
            raise ContractError(f"{where}: SecAgg+ settings without secagg on")
        if value.secagg and value.enabled:
            raise ContractError(
                f"{where}.dp: differential privacy cannot be combined with secure aggregation "
                "here (the clipping needs each site's update; SecAgg+ gives only the sum)"
            )
        return value

    @property
    def enabled(self) -> bool:
        return self.dp != "off"


def _check_secagg(spec: JobSpec) -> None:
    """SecAgg+ settings that fit the job's sites (Flower's own rules, ``SecAggPlusWorkflow``):
    shares 0 or 3..sites, threshold 0 or 2..shares−1; 2 sites at least; a strategy that needs only
    the weighted mean of the updates (``frp_flwr.strategies.secagg_problem``). Raises
    ``ContractError``."""
    privacy = spec.privacy
    shares, threshold = privacy.secagg_num_shares, privacy.secagg_threshold
    if not privacy.secagg:
        return
    n = len(spec.sites)
    if n < 2:
        raise ContractError("job-spec.privacy.secagg: secure aggregation needs 2 or more sites")
    from frp_flwr.choices import secagg_problem

    problem = secagg_problem(spec.strategy)
    if problem:
        raise ContractError(f"job-spec.strategy: {problem}")
    if shares and not 3 <= shares <= n:
        raise ContractError(
            f"job-spec.privacy.secagg_num_shares: {shares} is not 0 (one per site) or 3..{n}"
        )
    top = (shares or n) - 1
    if threshold and not 2 <= threshold <= top:
        raise ContractError(
            f"job-spec.privacy.secagg_threshold: {threshold} is not 0 (two thirds of the shares) "
            f"or 2..{top} (fewer than the shares)"
        )


@dataclass(frozen=True)
class JobSpec(_Record):
    """The parts of a job the Flower App needs; the ``job-spec`` run-config value, as JSON text.

    ``sites`` maps site id → SitePointer; ``features`` empty means "every numeric column except the
    target"; ``min_sites`` is the fewest replying sites a round may aggregate. ``task``:
    ``classification`` (softmax regression) or ``regression`` (linear regression). ``plans``: how
    each feature is encoded and its missing cells handled (``FeaturePlan``; a feature without a
    plan is numeric with median imputation). ``small_count``: categories held by at most this
    many rows at a site are merged into "other" there. ``model``: ``{"kind":
    "linear"|"mlp"|"xgboost", …hyper-parameters}`` (``frp_flwr.models.read_model_spec``);
    ``strategy``: ``{"name": "fedavg"|"fedprox"|…, …params}``
    (``frp_flwr.strategies.read_strategy_spec``; an ``xgboost`` model is always bagged with
    Flower's FedXgbBagging, ``frp_flwr.trees``); a spec without them means linear + FedAvg.
    ``privacy``: :class:`Privacy` (dp and SecAgg+ off when absent; with ``secagg`` on, the
    strategy must work from the weighted mean alone, ``frp_flwr.strategies.secagg_problem``).
    """

    sites: dict[str, SitePointer]
    target: str
    features: list[str] = field(default_factory=list)
    min_sites: int = 2
    task: str = "classification"
    plans: list[FeaturePlan] = field(default_factory=list)
    small_count: int = SMALL_COUNT
    model: dict = field(default_factory=lambda: {"kind": "linear"})
    strategy: dict = field(default_factory=lambda: {"name": "fedavg"})
    privacy: Privacy = field(default_factory=Privacy)

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        """Parse the JSON the portal wrote. Raises ``ContractError`` (a ``ValueError``)."""
        try:
            raw = json.loads(text, parse_constant=_no_constant)
        except (ValueError, RecursionError) as exc:
            raise ContractError(f"job-spec is not JSON: {exc}") from None
        spec = cls(
            **_read_fields(
                cls,
                raw,
                "job-spec",
                {
                    "sites": lambda v, w: read_site_map(v, w, SitePointer.from_json),
                    "target": lambda v, w: read_str(v, w, max_len=200),
                    "features": lambda v, w: [
                        read_str(f, f"{w}[{i}]", max_len=200)
                        for i, f in enumerate(read_list(v, w, max_items=10_000))
                    ],
                    "min_sites": lambda v, w: read_int(v, w, lo=1, hi=MAX_SITES),
                    "task": lambda v, w: _choice(v, w, TASKS),
                    "plans": lambda v, w: [
                        FeaturePlan.from_json(p, f"{w}[{i}]")
                        for i, p in enumerate(read_list(v, w, max_items=10_000))
                    ],
                    "small_count": lambda v, w: read_int(v, w, lo=0, hi=1_000_000),
                    "model": read_model_choice,
                    "strategy": read_strategy_choice,
                    "privacy": Privacy.from_json,
                },
            )
        )
        if not spec.sites:
            raise ContractError("job-spec.sites: no site")
        _check_secagg(spec)
        names = [p.name for p in spec.plans]
        if len(set(names)) != len(names):
            raise ContractError("job-spec.plans: a feature has two plans")
        unplanned = set(names) - set(spec.features)
        if unplanned:
            raise ContractError(f"job-spec.plans: {sorted(unplanned)} are not features")
        if spec.target in spec.features:
            raise ContractError("job-spec.features: the target cannot also be a feature")
        return spec

    @property
    def model_kind(self) -> str:
        """``model["kind"]`` (``"linear"`` for a spec without a model)."""
        return str(self.model.get("kind", "linear"))

    def plan(self, name: str) -> FeaturePlan:
        """The plan of feature ``name`` (the default plan when it has none)."""
        for plan in self.plans:
            if plan.name == name:
                return plan
        return FeaturePlan(name=name)

    def to_text(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"), allow_nan=False)


def _config_key(name: str) -> str:
    return name.replace("_", "-")


@dataclass(frozen=True)
class RunConfig:
    """One job's Flower run config: every key of ``[tool.flwr.app.config]``, with its default.

    Units: ``*-timeout`` and ``poll-interval`` in seconds; ``test-fraction`` is the share of each
    site's rows held out for evaluation (0 < f < 1). ``reply-log``: a file on the SuperLink's host
    where the ServerApp appends every reply it receives (empty: off). ``launch-nonce``: the
    portal's idempotency key of this launch, recorded on the job before the run is started, so the
    portal finds a run it already started (not a secret: every site sees it). ``resume-round``:
    ``0`` for a fresh run; ``k > 0`` resumes the job from its checkpoint after round ``k``
    (``frp_flwr.checkpoints``; the checkpoint is read from the store named by the ServerApp host's
    environment, so the key is a round number, not a secret).
    """

    job_id: int = 0
    job_spec: str = "{}"
    callback_url: str = ""
    num_rounds: int = 3
    local_epochs: int = 5
    learning_rate: float = 0.1
    batch_size: int = 32
    test_fraction: float = 0.2
    split_seed: int = 42
    round_timeout: float = 120.0
    discovery_timeout: float = 60.0
    poll_interval: float = 0.2
    contribution: bool = True
    reply_log: str = ""
    launch_nonce: str = ""
    resume_round: int = 0

    _READERS: ClassVar[dict] = {
        "job_id": lambda v, w: read_int(v, w, lo=0, hi=MAX_COUNT),
        "job_spec": lambda v, w: read_str(v, w, max_len=1_000_000),
        "callback_url": lambda v, w: read_str(v, w, max_len=2000),
        "num_rounds": lambda v, w: read_int(v, w, lo=1, hi=MAX_ROUNDS),
        "local_epochs": lambda v, w: read_int(v, w, lo=1, hi=1000),
        "learning_rate": lambda v, w: read_float(v, w, lo=1e-12, hi=1e6),
        "batch_size": lambda v, w: read_int(v, w, lo=1, hi=1_000_000),
        "test_fraction": lambda v, w: read_float(v, w, lo=1e-6, hi=1 - 1e-6),
        "split_seed": lambda v, w: read_int(v, w, lo=0, hi=2**32 - 1),
        "round_timeout": lambda v, w: read_float(v, w, lo=0.1, hi=MAX_SECONDS),
        "discovery_timeout": lambda v, w: read_float(v, w, lo=0.1, hi=MAX_SECONDS),
        "poll_interval": lambda v, w: read_float(v, w, lo=0.001, hi=60.0),
        "contribution": read_bool,
        "reply_log": lambda v, w: read_str(v, w, max_len=4096),
        "launch_nonce": lambda v, w: read_str(v, w, max_len=64),
        "resume_round": lambda v, w: read_int(v, w, lo=0, hi=MAX_ROUNDS),
    }

    @classmethod
    def keys(cls) -> list[str]:
        """The run-config keys, as Flower spells them (``job-id``, ``num-rounds`` …)."""
        return [_config_key(f.name) for f in fields(cls)]

    @classmethod
    def from_flower(cls, config: Mapping[str, Any]) -> RunConfig:
        """Parse Flower's ``context.run_config`` (defaults already merged in by Flower).

        Keys outside the contract are refused (a typo would otherwise silently use a default).
        Raises ``ContractError``.
        """
        names = {_config_key(f.name): f.name for f in fields(cls)}
        unknown = sorted(set(config) - set(names))
        if unknown:
            raise ContractError(f"run config: unknown key(s) {', '.join(unknown)}")
        values = {}
        for key, value in config.items():
            name = names[key]
            if isinstance(value, int) and not isinstance(value, bool) and name in _FLOAT_FIELDS:
                value = float(value)  # TOML writes 1 for 1.0 when a user types it so
            values[name] = cls._READERS[name](value, key)
        config_obj = cls(**values)
        if config_obj.callback_url and not config_obj.callback_url.startswith(
            ("http://", "https://")
        ):
            raise ContractError("callback-url: must be an http(s) URL")
        return config_obj

    def to_flower(self) -> dict[str, str | int | float | bool]:
        """Every key → value, for ``flwr run -c`` (validated first: raises ``ContractError``)."""
        out = {_config_key(f.name): getattr(self, f.name) for f in fields(self)}
        type(self).from_flower(out)
        return out

    @property
    def spec(self) -> JobSpec:
        """The parsed ``job-spec``. Raises ``ContractError``."""
        return JobSpec.from_json(self.job_spec)


_FLOAT_FIELDS = {f.name for f in fields(RunConfig) if f.type == "float"}


# ---------------------------------------------------------------------------------------------
# 2. Callback events (ServerApp → portal) and the portal's answer
# ---------------------------------------------------------------------------------------------

_SECONDS = {"lo": 0.0, "hi": MAX_SECONDS}
_LOSS = {"lo": 0.0, "hi": 1e12}
_ACCURACY = {"lo": 0.0, "hi": 1.0}


def _count(v, w):
    return read_int(v, w)


def _seconds(v, w):
    return read_float(v, w, **_SECONDS)


def _opt_seconds(v, w):
    return read_opt_float(v, w, **_SECONDS)


def _opt_loss(v, w):
    return read_opt_float(v, w, **_LOSS)


def _opt_accuracy(v, w):
    return read_opt_float(v, w, **_ACCURACY)


def _text(v, w):
    return read_str(v, w, max_len=MAX_TEXT)


def _site_list(v, w):
    return [read_site(s, f"{w}[{i}]") for i, s in enumerate(read_list(v, w, max_items=MAX_SITES))]


class Event(_Record):
    """Base of the callback events; ``name`` is the ``event`` field of the JSON body."""

    name: ClassVar[str] = ""
    _READERS: ClassVar[dict] = {}

    @classmethod
    def from_json(cls, raw: Mapping, where: str = ""):
        return cls(**_read_fields(cls, raw, where, cls._READERS, skip=("event", "seq")))


def _name_map(value: Any, where: str, item, *, max_items: int = 10_000) -> dict:
    """``{column or label name: item(value, where)}``."""
    return {
        read_str(k, f"{where} key", max_len=200): item(v, f"{where}.{str(k)[:40]}")
        for k, v in read_map(value, where, max_items=max_items).items()
    }


def _optional(reader):
    return lambda v, w: None if v is None else reader(v, w)


@dataclass(frozen=True)
class SitePreparation(_Record):
    """What one site did to its rows before training: ``rows`` in its dataset version,
    ``dropped_target`` (no target value), ``dropped_rows`` (a missing cell in a feature whose
    rule is "drop", or a label held by at most ``small_count`` rows at every site, which is never
    named), ``train_rows``/``test_rows`` kept, and per feature the cells imputed."""

    rows: int = 0
    dropped_target: int = 0
    dropped_rows: int = 0
    train_rows: int = 0
    test_rows: int = 0
    imputed: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: Any, where: str = "") -> SitePreparation:
        return cls(
            **_read_fields(
                cls,
                raw,
                where,
                {
                    "rows": _count,
                    "dropped_target": _count,
                    "dropped_rows": _count,
                    "train_rows": _count,
                    "test_rows": _count,
                    "imputed": lambda v, w: _name_map(v, w, _count),
                },
            )
        )


@dataclass(frozen=True)
class Preparation(_Record):
    """How a job's data were prepared, from federated statistics (posted with ``started``).

    ``columns``: the model's input columns (one-hot columns ``name=value``, ``name=(other)``,
    indicators ``name (missing)``); ``fills``: feature → the value its missing cells get, as text
    (``"median 4.2"``); ``notes``: readable remarks (a feature left out, categories merged);
    ``sites``: each site's :class:`SitePreparation`.
    """

    task: str = "classification"
    columns: list[str] = field(default_factory=list)
    fills: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    sites: dict[str, SitePreparation] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: Any, where: str = "") -> Preparation:
        return cls(
            **_read_fields(
                cls,
                raw,
                where,
                {
                    "task": lambda v, w: _choice(v, w, TASKS),
                    "columns": lambda v, w: [
                        read_str(c, f"{w}[{i}]", max_len=500)
                        for i, c in enumerate(read_list(v, w, max_items=20_000))
                    ],
                    "fills": lambda v, w: _name_map(v, w, _text),
                    "notes": lambda v, w: [
                        _text(n, f"{w}[{i}]") for i, n in enumerate(read_list(v, w, max_items=200))
                    ],
                    "sites": lambda v, w: read_site_map(v, w, SitePreparation.from_json),
                },
            )
        )


@dataclass(frozen=True)
class Started(Event):
    """Discovery is over: the job's sites → node ids, sites not connected, sites that erred, and
    (when the sites got that far) how the data were prepared."""

    nodes: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    preparation: Preparation | None = None

    name: ClassVar[str] = "started"
    _READERS: ClassVar[dict] = {
        "nodes": lambda v, w: read_site_map(
            v, w, lambda n, ww: read_str(n, ww, max_len=20, pattern=_NODE_RE)
        ),
        "missing": _site_list,
        "errors": lambda v, w: read_site_map(v, w, _text),
        "preparation": _optional(Preparation.from_json),
    }


@dataclass(frozen=True)
class SiteRound(_Record):
    """One site's part of a round: its replies' metrics and metering, or its error.

    Metering is the site's ClientApp's own: CPU and wall seconds, and the protobuf size (bytes) of
    the model ArrayRecords it received and sent.
    """

    node_id: str = ""
    ok: bool = False
    error: str = ""
    train_examples: int = 0
    eval_examples: int = 0
    train_loss: float | None = None
    eval_loss: float | None = None
    eval_accuracy: float | None = None
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0
    bytes_received: int = 0
    bytes_sent: int = 0

    @classmethod
    def from_json(cls, raw: Mapping, where: str = "") -> SiteRound:
        return cls(
            **_read_fields(
                cls,
                raw,
                where,
                {
                    "node_id": lambda v, w: read_str(v, w, max_len=20, pattern=_NODE_OR_EMPTY_RE),
                    "ok": read_bool,
                    "error": _text,
                    "train_examples": _count,
                    "eval_examples": _count,
                    "train_loss": _opt_loss,
                    "eval_loss": _opt_loss,
                    "eval_accuracy": _opt_accuracy,
                    "cpu_seconds": _seconds,
                    "wall_seconds": _seconds,
                    "bytes_received": _count,
                    "bytes_sent": _count,
                },
            )
        )


@dataclass(frozen=True)
class Round(Event):
    """One FedAvg round: the aggregate (example-weighted over replying sites) and every site.

    ``partial``: the round ended early (too few replies); only the sites' parts are recorded.
    """

    round: int
    sites: dict[str, SiteRound] = field(default_factory=dict)
    partial: bool = False
    train_loss: float | None = None
    eval_loss: float | None = None
    eval_accuracy: float | None = None
    train_examples: int = 0
    eval_examples: int = 0
    wall_seconds: float | None = None

    name: ClassVar[str] = "round"
    _READERS: ClassVar[dict] = {
        "round": lambda v, w: read_int(v, w, lo=1, hi=MAX_ROUNDS),
        "sites": lambda v, w: read_site_map(v, w, SiteRound.from_json),
        "partial": read_bool,
        "train_loss": _opt_loss,
        "eval_loss": _opt_loss,
        "eval_accuracy": _opt_accuracy,
        "train_examples": _count,
        "eval_examples": _count,
        "wall_seconds": _opt_seconds,
    }


def _confusion(value: Any, where: str) -> list[list[int]]:
    rows = read_list(value, where, max_items=1000)
    out = [
        [
            read_int(x, f"{where}[{i}][{j}]")
            for j, x in enumerate(read_list(r, f"{where}[{i}]", max_items=1000))
        ]
        for i, r in enumerate(rows)
    ]
    if any(len(r) != len(out) for r in out):
        raise ContractError(f"{where}: not a square matrix")
    return out


@dataclass(frozen=True)
class Metrics(_Record):
    """Held-out metrics of a model, at one site or pooled over sites.

    Classification: ``accuracy``, ``balanced_accuracy`` (mean recall over the classes present),
    ``macro_f1``, ``roc_auc`` (binary tasks only; pooled, ``roc_auc_bound`` is the most it can
    differ from the exact value, ``metrics.pooled_roc_auc``), ``log_loss`` (mean cross-entropy, nats) and
    the ``confusion`` matrix (rows: true class, columns: predicted, in the job's class order;
    exact counts — the portal shows counts under the small-count threshold as "≤ 7").
    Regression: ``rmse``, ``mae`` (target units) and ``r2``.
    """

    examples: int = 0
    accuracy: float | None = None
    balanced_accuracy: float | None = None
    macro_f1: float | None = None
    roc_auc: float | None = None
    roc_auc_bound: float | None = None
    log_loss: float | None = None
    confusion: list[list[int]] = field(default_factory=list)
    rmse: float | None = None
    mae: float | None = None
    r2: float | None = None

    @classmethod
    def from_json(cls, raw: Any, where: str = "") -> Metrics:
        unit = _opt_accuracy
        return cls(
            **_read_fields(
                cls,
                raw,
                where,
                {
                    "examples": _count,
                    "accuracy": unit,
                    "balanced_accuracy": unit,
                    "macro_f1": unit,
                    "roc_auc": unit,
                    "roc_auc_bound": unit,
                    "log_loss": _opt_loss,
                    "confusion": _confusion,
                    "rmse": lambda v, w: read_opt_float(v, w, lo=0.0, hi=1e15),
                    "mae": lambda v, w: read_opt_float(v, w, lo=0.0, hi=1e15),
                    "r2": lambda v, w: read_opt_float(v, w, lo=-1e15, hi=1.0),
                },
            )
        )


@dataclass(frozen=True)
class Baseline(_Record):
    """The final model against the trivial one: the majority class of the pooled training
    labels (``metric`` ``accuracy``) or the pooled training mean of the target (``rmse``), both
    scored on the pooled held-out splits. ``better``: the model beats it (higher accuracy, lower
    RMSE)."""

    name: str
    metric: str
    value: float | None = None
    model: float | None = None
    better: bool = False

    @classmethod
    def from_json(cls, raw: Any, where: str = "") -> Baseline:
        return cls(
            **_read_fields(
                cls,
                raw,
                where,
                {
                    "name": lambda v, w: read_str(v, w, max_len=200),
                    "metric": lambda v, w: _choice(v, w, ("accuracy", "rmse")),
                    "value": lambda v, w: read_opt_float(v, w, lo=0.0, hi=1e15),
                    "model": lambda v, w: read_opt_float(v, w, lo=0.0, hi=1e15),
                    "better": read_bool,
                },
            )
        )


@dataclass(frozen=True)
class SiteEvaluation(_Record):
    """A site's evaluation of the final model on its held-out split."""

    eval_examples: int = 0
    eval_loss: float | None = None
    eval_accuracy: float | None = None
    metrics: Metrics | None = None

    @classmethod
    def from_json(cls, raw: Mapping, where: str = "") -> SiteEvaluation:
        return cls(
            **_read_fields(
                cls,
                raw,
                where,
                {
                    "eval_examples": _count,
                    "eval_loss": _opt_loss,
                    "eval_accuracy": _opt_accuracy,
                    "metrics": _optional(Metrics.from_json),
                },
            )
        )


def read_model(value: Any, where: str) -> list:
    """A model: a list of layers, each a (nested, at most 3 levels) list of finite numbers."""
    layers = read_list(value, where, max_items=100)
    total = 0

    def walk(node, w, depth):
        nonlocal total
        if isinstance(node, list):
            if depth >= 3:
                raise ContractError(f"{w}: nested deeper than 3 levels")
            return [walk(x, f"{w}[{i}]", depth + 1) for i, x in enumerate(node)]
        total += 1
        if total > MAX_MODEL_VALUES:
            raise ContractError(f"{where}: more than {MAX_MODEL_VALUES} numbers")
        return read_float(node, w)

    return [walk(layer, f"{where}[{i}]", 0) for i, layer in enumerate(layers)]


def read_json_tree(value: Any, where: str, *, depth: int = 0) -> Any:
    """A JSON value nested at most 5 levels, of short strings (≤ 500 characters), booleans,
    null and finite numbers — e.g. the fitted preprocessing, pooled statistics only."""
    if depth > 5:
        raise ContractError(f"{where}: nested deeper than 5 levels")
    if isinstance(value, dict):
        return {
            read_str(k, f"{where} key", max_len=500): read_json_tree(
                v, f"{where}.{k}", depth=depth + 1
            )
            for k, v in read_map(value, where, max_items=20_000).items()
        }
    if isinstance(value, list):
        return [
            read_json_tree(v, f"{where}[{i}]", depth=depth + 1)
            for i, v in enumerate(read_list(value, where, max_items=20_000))
        ]
    if isinstance(value, str):
        return read_str(value, where, max_len=500)
    if value is None or isinstance(value, bool):
        return value
    return (
        read_float(value, where)
        if isinstance(value, float)
        else read_int(value, where, lo=-MAX_COUNT)
    )


@dataclass(frozen=True)
class Finished(Event):
    """Training is over: the final model, its federated evaluation and each site's evaluation."""

    rounds: int
    eval_accuracy: float | None = None
    eval_loss: float | None = None
    eval_examples: int = 0
    classes: list[str] = field(default_factory=list)
    model: list = field(default_factory=list)
    sites: dict[str, SiteEvaluation] = field(default_factory=dict)
    metrics: Metrics | None = None
    baseline: Baseline | None = None
    preprocessing: dict = field(default_factory=dict)

    name: ClassVar[str] = "finished"
    _READERS: ClassVar[dict] = {
        "rounds": lambda v, w: read_int(v, w, lo=0, hi=MAX_ROUNDS),
        "eval_accuracy": _opt_accuracy,
        "eval_loss": _opt_loss,
        "eval_examples": _count,
        "classes": lambda v, w: [
            read_str(c, f"{w}[{i}]", max_len=200)
            for i, c in enumerate(read_list(v, w, max_items=10_000))
        ],
        "model": read_model,
        "sites": lambda v, w: read_site_map(v, w, SiteEvaluation.from_json),
        "metrics": _optional(Metrics.from_json),
        "baseline": _optional(Baseline.from_json),
        "preprocessing": lambda v, w: read_json_tree(read_map(v, w, max_items=64), w),
    }


@dataclass(frozen=True)
class Metering(_Record):
    """A site's metered work on one message: held-out examples scored, CPU/wall s, bytes in/out."""

    examples: int = 0
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0
    bytes_received: int = 0
    bytes_sent: int = 0

    @classmethod
    def from_json(cls, raw: Mapping, where: str = "") -> Metering:
        return cls(
            **_read_fields(
                cls,
                raw,
                where,
                {
                    "examples": _count,
                    "cpu_seconds": _seconds,
                    "wall_seconds": _seconds,
                    "bytes_received": _count,
                    "bytes_sent": _count,
                },
            )
        )


def _utilities(value: Any, where: str) -> dict[str, dict[str, float]]:
    tables = read_map(value, where, max_items=MAX_ROUNDS + 1)
    out: dict[str, dict[str, float]] = {}
    total = 0
    for rnd, table in tables.items():
        w = f"{where}.{rnd}"
        if not isinstance(rnd, str) or not rnd.isdigit() or int(rnd) > MAX_ROUNDS:
            raise ContractError(f"{where}: round key {str(rnd)[:20]!r} is not 0..{MAX_ROUNDS}")
        table = read_map(table, w, max_items=MAX_UTILITIES)
        total += len(table)
        if total > MAX_UTILITIES:
            raise ContractError(f"{where}: more than {MAX_UTILITIES} utilities")
        clean = {}
        for key, number in table.items():
            read_str(key, f"{w} key", max_len=5 * 1024, pattern=_COALITION_RE)
            clean[key] = read_float(number, f"{w}.{key or '∅'}", lo=-1e6, hi=1e6)
        out[str(int(rnd))] = clean
    return out


@dataclass(frozen=True)
class Contribution(Event):
    """Coalition utilities for the portal's Shapley values (ADR 0010), or why there are none.

    ``players``: site ids, index = player number; ``utilities``: round key (``"0"`` is the whole
    run) → coalition key (ascending player indexes joined by commas, ``""`` the empty one) → utility.
    ``disagreement``: per evaluating site, the mean absolute difference between its accuracies and
    the utilities (the sites' median, ADR 0024); a site far from the others stands out there.
    """

    players: list[str] = field(default_factory=list)
    error: str = ""
    method: str = ""
    permutations: int = 0
    seed: int = 0
    utility: str = ""
    utilities: dict[str, dict[str, float]] = field(default_factory=dict)
    examples: dict[str, int] = field(default_factory=dict)
    models: int = 0
    sites: dict[str, Metering] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    wall_seconds: float | None = None
    disagreement: dict[str, float] = field(default_factory=dict)

    name: ClassVar[str] = "contribution"
    _READERS: ClassVar[dict] = {
        "players": _site_list,
        "error": _text,
        "method": lambda v, w: read_str(v, w, max_len=16, pattern=re.compile(r"^(exact|gtg|)$")),
        "permutations": lambda v, w: read_int(v, w, hi=1_000_000),
        "seed": lambda v, w: read_int(v, w, hi=2**63 - 1),
        "utility": lambda v, w: read_str(v, w, max_len=200),
        "utilities": _utilities,
        "examples": lambda v, w: read_site_map(v, w, _count),
        "models": _count,
        "sites": lambda v, w: read_site_map(v, w, Metering.from_json),
        "errors": lambda v, w: read_site_map(v, w, _text),
        "wall_seconds": _opt_seconds,
        "disagreement": lambda v, w: read_site_map(
            v, w, lambda x, ww: read_float(x, ww, lo=0.0, hi=1.0)
        ),
    }

    def __post_init__(self) -> None:
        if len(set(self.players)) != len(self.players):
            raise ContractError("players: a site is named twice")
        n = len(self.players)
        for rnd, table in self.utilities.items():
            for key in table:
                if key and any(int(i) >= n for i in key.split(",")):
                    raise ContractError(f"utilities.{rnd}: coalition {key!r} names no player")


@dataclass(frozen=True)
class Failed(Event):
    """The ServerApp gave up; ``reason`` is shown to the researcher (already path-free)."""

    reason: str = "the ServerApp failed"

    name: ClassVar[str] = "failed"
    _READERS: ClassVar[dict] = {"reason": _text}


#: Event name → class.
EVENTS: dict[str, type[Event]] = {
    c.name: c for c in (Started, Round, Finished, Contribution, Failed)
}


def _no_constant(name: str):
    raise ContractError(f"{name} is not a number JSON allows")


def encode_event(event: Event, *, seq: int) -> bytes:
    """The JSON body of ``event`` as the ``seq``-th event of its run (UTF-8 bytes).

    Raises ``ContractError`` when the event does not parse back (a non-finite number, a value out
    of range): a sender finds its own mistakes before the portal does.
    """
    read_int(seq, "seq", lo=1, hi=MAX_SEQ)
    fields_json = event.to_json()
    type(event).from_json(fields_json)  # the receiver's checks, on the sender's side
    return json.dumps(
        {"event": event.name, "seq": seq, **fields_json}, separators=(",", ":"), allow_nan=False
    ).encode()


def parse_event(body: bytes) -> tuple[int, Event]:
    """Parse a callback body into ``(seq, event)``. Raises ``ContractError`` with the reason.

    Checks, before any field is used: size (``MAX_EVENT_BYTES``), UTF-8 JSON without NaN or
    infinity literals, nesting the JSON decoder can follow, a JSON object with a known ``event``
    and a ``seq`` in 1..2⁵³, and every field of that event (types, ranges, sizes).
    """
    if len(body) > MAX_EVENT_BYTES:
        raise ContractError(f"body larger than {MAX_EVENT_BYTES} bytes")
    try:
        raw = json.loads(body, parse_constant=_no_constant)
    except RecursionError:
        raise ContractError("body is nested too deeply") from None
    except ContractError:
        raise
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise ContractError(f"body is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ContractError(f"body must be a JSON object, not {_kind(raw)}")
    name = raw.get("event")
    cls = EVENTS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ContractError(f"event: unknown event {str(name)[:40]!r}")
    seq = read_int(raw.get("seq"), "seq", lo=1, hi=MAX_SEQ)
    return seq, cls.from_json(raw)


@dataclass(frozen=True)
class SiteLimits(_Record):
    """What the portal knows of a site, which the site cannot change, to bound its replies:
    ``rows`` of the dataset version the job trains on (registered at ingest) and ``cores`` the
    site's ClientApp is allocated. Sent to the ServerApp only (in the portal's answers), never in
    the run config: other sites must not learn a site's exact row count."""

    rows: int
    cores: int = 1

    @classmethod
    def from_json(cls, raw: Any, where: str = "") -> SiteLimits:
        return cls(
            **_read_fields(
                cls,
                raw,
                where,
                {"rows": _count, "cores": lambda v, w: read_int(v, w, lo=1, hi=1_000_000)},
            )
        )


@dataclass(frozen=True)
class CallbackAnswer(_Record):
    """The portal's answer to an event: ``drop_sites`` are sites to leave out from the next round
    (a revoked grant, or replies out of bounds); ``limits`` bound each site's replies
    (:class:`SiteLimits`); ``error`` says why an event was refused. ``contribution``: false once
    the portal no longer allows the closing evaluation to send coalition models (a data steward
    withdrew the Shapley opt-in, or a site's grant was revoked, during the run: ADR 0036); the
    ServerApp then measures no contribution, whatever its run config said. Absent: true."""

    ok: bool = True
    drop_sites: list[str] = field(default_factory=list)
    error: str = ""
    limits: dict[str, SiteLimits] = field(default_factory=dict)
    contribution: bool = True

    @classmethod
    def from_json(cls, raw: Any, where: str = "answer") -> CallbackAnswer:
        """Parse the portal's JSON answer. Raises ``ContractError``."""
        return cls(
            **_read_fields(
                cls,
                raw,
                where,
                {
                    "ok": read_bool,
                    "drop_sites": _site_list,
                    "error": _text,
                    "limits": lambda v, w: read_site_map(v, w, SiteLimits.from_json),
                    "contribution": read_bool,
                },
            )
        )


# ---------------------------------------------------------------------------------------------
# Bounds on what a site reports about itself (hostile re-test of issue 9, finding 1a)
# ---------------------------------------------------------------------------------------------

#: Clock slack (seconds) when a site's own CPU or wall seconds are compared with time measured
#: on the ServerApp's side (timer resolution, process start inside the message's window).
METERING_SLACK_SECONDS = 1.0


def held_out_bounds(rows: int, *, test_fraction: float, classes: int) -> tuple[int, int]:
    """``(lo, hi)`` of the held-out rows of a site with ``rows`` rows (``task.stratified_split``).

    The split holds out ``round(n_c · test_fraction)`` rows of each class ``c``, so the total is
    within ``classes / 2`` of ``rows · test_fraction`` (each rounding moves it by at most 0.5).
    ``classes`` is the number of classes the job has (at most ``rows`` of them at one site).
    """
    k = min(max(classes, 1), max(rows, 1))
    expected = rows * test_fraction
    return max(0, math.ceil(expected - k / 2)), min(rows, math.floor(expected + k / 2))


def examples_problem(
    kind: str, num_examples: int, limits: SiteLimits, *, test_fraction: float, classes: int
) -> str:
    """Why a reply's ``num_examples`` cannot be true ("" when it can).

    ``kind``: ``"train"`` (the training split: ``rows`` minus the held-out rows) or ``"test"``
    (the held-out split, scored by evaluate and coalition replies). Only the upper bound is
    checked: the federated preprocessing leaves out rows without a target before the split and
    may drop rows with a missing feature (``preprocess``), so a split may hold fewer rows than
    ``rows`` implies (ADR 0024).
    """
    lo, hi = held_out_bounds(limits.rows, test_fraction=test_fraction, classes=classes)
    if kind == "train":
        hi = limits.rows - lo
    if num_examples <= hi:
        return ""
    return (
        f"reported {about(num_examples)} {kind} examples; the dataset version registered for this "
        f"site has {about(limits.rows)} rows, so its {kind} split holds at most {about(hi)}"
    )


def metering_problem(
    cpu_seconds: float, wall_seconds: float, elapsed: float, limits: SiteLimits
) -> str:
    """Why a reply's CPU and wall seconds cannot be true ("" when they can).

    ``elapsed``: seconds the ServerApp measured from sending the message to receiving the reply
    (its own clock). A site's wall seconds fit in that window and its CPU seconds in
    ``cores × window`` (each plus ``METERING_SLACK_SECONDS``).
    """
    window = max(elapsed, 0.0) + METERING_SLACK_SECONDS
    if wall_seconds > window:
        return f"reported {wall_seconds:.3g} wall seconds for a reply that took {elapsed:.3g} s"
    if cpu_seconds > limits.cores * window:
        return (
            f"reported {cpu_seconds:.3g} CPU seconds for a reply that took {elapsed:.3g} s "
            f"on {limits.cores} allocated core(s)"
        )
    return ""


# ---------------------------------------------------------------------------------------------
# 3. Site replies (ClientApp → ServerApp metric and config records, as plain mappings)
# ---------------------------------------------------------------------------------------------


def _record(raw: Any, where: str) -> dict:
    if not isinstance(raw, Mapping):
        raise ContractError(f"{where}: expected a record, got {_kind(raw)}")
    return dict(raw.items())


def _floats(value: Any, where: str, *, length: int | None = None, **bounds) -> list[float]:
    items = read_list(value, where, max_items=MAX_UTILITIES)
    if length is not None and len(items) != length:
        raise ContractError(f"{where}: {len(items)} values, expected {length}")
    return [read_float(x, f"{where}[{i}]", **bounds) for i, x in enumerate(items)]


#: The shape of the ServerApp ↔ ClientApp messages (both ship in one Flower App bundle, so they
#: change together; the bundle's ``pyproject.toml`` version follows). 2: fused rounds (issue 12,
#: ADR 0032) — a train message whose config says :data:`EVALUATE_INCOMING` is answered with the
#: training's ``metrics`` (:class:`TrainReply`) and ``arrays`` and the received model's evaluation
#: (:data:`EVALUATION_RECORD`, an :class:`EvaluateReply`), or, when the training failed after the
#: evaluation, the evaluation and :data:`TRAIN_ERROR_RECORD` (``{"error": text}``) without
#: weights; the closing ``evaluate`` message may carry the coalition models (``models`` and config
#: ``coalition-keys``, as ``evaluate.coalitions``), answered beside the evaluation's ``metrics`` in
#: :data:`COALITIONS_RECORD` (a :class:`CoalitionReply`) or :data:`COALITION_ERROR_RECORD`.
MESSAGES_VERSION = 2
#: Config key of a train message: evaluate the received global model first (bool).
EVALUATE_INCOMING = "evaluate-incoming"
#: Record names of the fused replies (see :data:`MESSAGES_VERSION`).
EVALUATION_RECORD = "evaluation"
TRAIN_ERROR_RECORD = "train-error"
COALITIONS_RECORD = "coalitions"
COALITION_ERROR_RECORD = "coalition-error"


def reply_error(record: Any, where: str) -> str:
    """The text of a ``{"error": text}`` record (:data:`TRAIN_ERROR_RECORD`,
    :data:`COALITION_ERROR_RECORD`). Raises ``ContractError``."""
    return _text(_record(record, where).get("error"), f"{where}.error")


class _Reply:
    """Mixin of the metric replies: kebab-case record keys ↔ snake_case fields."""

    _READERS: ClassVar[dict] = {}

    @classmethod
    def from_record(cls, raw: Any, where: str = "reply"):
        record = _record(raw, where)
        values = {}
        for f in fields(cls):
            key = _config_key(f.name)
            if key not in record:
                raise ContractError(f"{where}: missing {key}")
            value = record[key]
            values[f.name] = cls._READERS[f.name](value, f"{where}.{key}")
        return cls(**values)

    def as_record(self) -> dict:
        return {_config_key(f.name): getattr(self, f.name) for f in fields(self)}


_METERING_READERS = {
    "bytes_received": _count,
    "bytes_sent": _count,
    "cpu_seconds": _seconds,
    "wall_seconds": _seconds,
}


@dataclass(frozen=True)
class SiteInfo(_Reply):
    """The ``info`` record of a discovery (query) reply: who the node is; for a member site also
    its feature names and its labels (as strings)."""

    site: str
    member: bool
    features: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    error: str = ""  # a member that cannot take part says why here (path-free), not by raising

    @classmethod
    def from_record(cls, raw: Any, where: str = "info") -> SiteInfo:
        record = _record(raw, where)
        out = SiteInfo(
            site=read_site(record.get("site"), f"{where}.site"),
            member=read_bool(record.get("member"), f"{where}.member"),
            error=_text(record.get("error", ""), f"{where}.error"),
            features=[
                read_str(x, f"{where}.features[{i}]", max_len=200)
                for i, x in enumerate(
                    read_list(record.get("features", []), f"{where}.features", max_items=10_000)
                )
            ],
            labels=[
                read_str(x, f"{where}.labels[{i}]", max_len=200)
                for i, x in enumerate(
                    read_list(record.get("labels", []), f"{where}.labels", max_items=10_000)
                )
            ],
        )
        return out

    def as_record(self) -> dict:
        """As a ConfigRecord's items; empty lists and an empty error left out (Flower cannot type
        an empty list)."""
        return {k: v for k, v in super().as_record().items() if v != [] and v != ""}


@dataclass(frozen=True)
class TrainReply(_Reply):
    """The ``metrics`` record of a train reply (the weights travel beside it as ``arrays``)."""

    num_examples: int
    train_loss: float
    bytes_received: int
    bytes_sent: int
    cpu_seconds: float
    wall_seconds: float

    _READERS: ClassVar[dict] = {
        "num_examples": _count,
        "train_loss": lambda v, w: read_float(v, w, **_LOSS),
        **_METERING_READERS,
    }


@dataclass(frozen=True)
class EvaluateReply(_Reply):
    """The ``metrics`` record of an evaluate reply: the global model on the held-out split."""

    num_examples: int
    eval_loss: float
    eval_accuracy: float
    bytes_received: int
    bytes_sent: int
    cpu_seconds: float
    wall_seconds: float

    _READERS: ClassVar[dict] = {
        "num_examples": _count,
        "eval_loss": lambda v, w: read_float(v, w, **_LOSS),
        "eval_accuracy": lambda v, w: read_float(v, w, **_ACCURACY),
        **_METERING_READERS,
    }


@dataclass(frozen=True)
class CoalitionReply(_Reply):
    """The ``metrics`` record of an ``evaluate.coalitions`` reply: per coalition model (in the
    order of the message's ``coalition-keys``) its held-out loss and accuracy."""

    num_examples: int
    coalition_loss: list[float]
    coalition_accuracy: list[float]
    bytes_received: int
    bytes_sent: int
    cpu_seconds: float
    wall_seconds: float

    _READERS: ClassVar[dict] = {
        "num_examples": _count,
        "coalition_loss": lambda v, w: _floats(v, w, **_LOSS),
        "coalition_accuracy": lambda v, w: _floats(v, w, **_ACCURACY),
        **_METERING_READERS,
    }


# Replies too nested for a MetricRecord travel as JSON text in a ConfigRecord ``{"json": text}``.


def reply_json(record: Any, where: str) -> Any:
    """The JSON value in a ConfigRecord ``{"json": text}``. Raises ``ContractError``."""
    record = _record(record, where)
    text = read_str(record.get("json"), f"{where}.json", max_len=MAX_EVENT_BYTES)
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ContractError:
        raise
    except (ValueError, RecursionError) as exc:
        raise ContractError(f"{where}: not JSON ({exc})") from None


def json_record(value: _Record | dict) -> dict:
    """``{"json": text}`` for a ConfigRecord (raises ``ValueError`` for a non-finite number)."""
    body = value.to_json() if hasattr(value, "to_json") else value
    return {"json": json.dumps(body, separators=(",", ":"), allow_nan=False)}


@dataclass(frozen=True)
class FeatureSummary(_Record):
    """One feature at one site, over its training rows: cells ``missing``; for a numeric or date
    feature the observed count ``n``, ``mean`` and ``m2`` (sum of squared deviations); for a
    categorical one the ``categories`` held by more than ``small_count`` rows (value → rows) and
    the rows of all other values together (``other``)."""

    missing: int = 0
    n: int = 0
    mean: float = 0.0
    m2: float = 0.0
    categories: dict[str, int] = field(default_factory=dict)
    other: int = 0

    @classmethod
    def from_json(cls, raw: Any, where: str = "") -> FeatureSummary:
        return cls(
            **_read_fields(
                cls,
                raw,
                where,
                {
                    "missing": _count,
                    "n": _count,
                    "mean": read_float,
                    "m2": lambda v, w: read_float(v, w, lo=0.0),
                    "categories": lambda v, w: _name_map(v, w, _count, max_items=1000),
                    "other": _count,
                },
            )
        )


@dataclass(frozen=True)
class SiteSummary(_Record):
    """A member site's first statistics (the ``summary`` record of its discovery reply): its
    ``rows``, rows without a target value, target ``labels`` (label → rows, classification), and
    per feature a :class:`FeatureSummary` of its training rows."""

    rows: int = 0
    target_missing: int = 0
    labels: dict[str, int] = field(default_factory=dict)
    features: dict[str, FeatureSummary] = field(default_factory=dict)

    @classmethod
    def from_record(cls, raw: Any, where: str = "summary") -> SiteSummary:
        return cls(
            **_read_fields(
                cls,
                reply_json(raw, where),
                where,
                {
                    "rows": _count,
                    "target_missing": _count,
                    "labels": lambda v, w: _name_map(v, w, _count),
                    "features": lambda v, w: _name_map(v, w, FeatureSummary.from_json),
                },
            )
        )


@dataclass(frozen=True)
class SiteQuantiles(_Record):
    """Per feature, the site's training cells at or below each point of the ServerApp's grid
    (cumulative counts, for a federated median)."""

    features: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def from_record(cls, raw: Any, where: str = "quantiles") -> SiteQuantiles:
        def counts(v, w):
            return [_count(x, f"{w}[{i}]") for i, x in enumerate(read_list(v, w, max_items=4096))]

        return cls(
            **_read_fields(
                cls,
                reply_json(raw, where),
                where,
                {"features": lambda v, w: _name_map(v, w, counts)},
            )
        )


@dataclass(frozen=True)
class DesignStats(_Record):
    """A site's prepared training matrix, summarised for federated standardisation: rows
    ``num_examples``, per column ``mean`` and ``m2``; the training ``labels`` kept (label → rows)
    or, for regression, the target's ``target_n``/``target_mean``/``target_m2``; and what was
    done to the rows (:class:`SitePreparation`)."""

    num_examples: int = 0
    mean: list[float] = field(default_factory=list)
    m2: list[float] = field(default_factory=list)
    labels: dict[str, int] = field(default_factory=dict)
    target_n: int = 0
    target_mean: float = 0.0
    target_m2: float = 0.0
    preparation: SitePreparation = field(default_factory=SitePreparation)

    @classmethod
    def from_record(cls, raw: Any, where: str = "design") -> DesignStats:
        out = cls(
            **_read_fields(
                cls,
                reply_json(raw, where),
                where,
                {
                    "num_examples": _count,
                    "mean": lambda v, w: _floats(v, w),
                    "m2": lambda v, w: _floats(v, w, lo=0.0),
                    "labels": lambda v, w: _name_map(v, w, _count),
                    "target_n": _count,
                    "target_mean": read_float,
                    "target_m2": lambda v, w: read_float(v, w, lo=0.0),
                    "preparation": SitePreparation.from_json,
                },
            )
        )
        if len(out.mean) != len(out.m2):
            raise ContractError(f"{where}: one mean and one m2 per column expected")
        return out


@dataclass(frozen=True)
class EvalReport(_Record):
    """A site's aggregates of the final model on its held-out split (the ``report`` record of
    the last round's evaluate reply), from which the ServerApp computes site and pooled metrics.

    Classification: ``confusion`` (true × predicted counts), ``log_loss_sum`` (nats, summed over
    rows), for two classes the site's exact ``roc_auc`` and ``auc_pos``/``auc_neg``: rows per bin
    of P(second class) (``AUC_BINS`` equal bins of [0, 1]) for the pooled AUC. Regression (target
    units): ``sse``, ``sae``, ``sum_y``, ``sum_y2`` and ``sse_baseline`` (the pooled training
    mean as the prediction).
    """

    examples: int = 0
    confusion: list[list[int]] = field(default_factory=list)
    log_loss_sum: float = 0.0
    roc_auc: float | None = None
    auc_pos: list[int] = field(default_factory=list)
    auc_neg: list[int] = field(default_factory=list)
    sse: float = 0.0
    sae: float = 0.0
    sum_y: float = 0.0
    sum_y2: float = 0.0
    sse_baseline: float = 0.0

    @classmethod
    def from_record(cls, raw: Any, where: str = "report") -> EvalReport:
        def bins(v, w):
            items = read_list(v, w, max_items=AUC_BINS)
            return [_count(x, f"{w}[{i}]") for i, x in enumerate(items)]

        big = {"lo": 0.0, "hi": 1e300}
        return cls(
            **_read_fields(
                cls,
                reply_json(raw, where),
                where,
                {
                    "examples": _count,
                    "confusion": _confusion,
                    "log_loss_sum": lambda v, w: read_float(v, w, **big),
                    "roc_auc": _opt_accuracy,
                    "auc_pos": bins,
                    "auc_neg": bins,
                    "sse": lambda v, w: read_float(v, w, **big),
                    "sae": lambda v, w: read_float(v, w, **big),
                    "sum_y": read_float,
                    "sum_y2": lambda v, w: read_float(v, w, **big),
                    "sse_baseline": lambda v, w: read_float(v, w, **big),
                },
            )
        )


#: Bins of the predicted probability for the pooled ROC AUC (see :class:`EvalReport`).
AUC_BINS = 1000
