"""CRediT, the Contributor Roles Taxonomy (ANSI/NISO Z39.104-2022): the 14 roles and their rendering.

Pure Python, no Django: the role list (name, slug, the standard's term URI and definition), role
validation, the percentage format, the paper paragraph ("Conceptualization: A, B. Data curation:
Hospital A (42 %), …"), the lines saying how the job was trained and credited (model, strategy,
ε, SecAgg+, contribution method; the wording is ``federation.method``'s), and the JSON document
and text export of a statement. ``accounting.services.credit`` stores
statements; this module only describes and renders them.

Source: ANSI/NISO Z39.104-2022, *CRediT, Contributor Roles Taxonomy* (approved 2022-01-14), and its
term pages ``https://credit.niso.org/contributor-roles/<slug>/``. Names keep the standard's spelling:
"Formal analysis" with a lower-case a, and an EN DASH (U+2013) in "Writing – original draft" and
"Writing – review & editing".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from federation.method import SECAGG_LABEL

STANDARD = "ANSI/NISO Z39.104-2022"
URI_BASE = "https://credit.niso.org/contributor-roles/"

PERSON = "person"
INSTITUTION = "institution"
KINDS = (PERSON, INSTITUTION)


class UnknownRole(ValueError):
    """A role slug that is not one of the 14 CRediT roles."""


@dataclass(frozen=True)
class CreditRole:
    """One CRediT role: ``slug`` (the last path segment of its term URI), ``name`` as the
    standard spells it, and its ``definition``."""

    slug: str
    name: str
    definition: str

    @property
    def uri(self) -> str:
        """The role's term URI, e.g. ``https://credit.niso.org/contributor-roles/data-curation/``."""
        return f"{URI_BASE}{self.slug}/"

    def as_dict(self) -> dict[str, str]:
        """``{"slug", "name", "uri"}`` — the role as the JSON export writes it."""
        return {"slug": self.slug, "name": self.name, "uri": self.uri}


# The standard's order (alphabetical by name). Everything that lists roles uses this order.
ROLES: tuple[CreditRole, ...] = (
    CreditRole(
        "conceptualization",
        "Conceptualization",
        "Ideas; formulation or evolution of overarching research goals and aims.",
    ),
    CreditRole(
        "data-curation",
        "Data curation",
        "Management activities to annotate (produce metadata), scrub data and maintain research "
        "data (including software code, where it is necessary for interpreting the data itself) "
        "for initial use and later re-use.",
    ),
    CreditRole(
        "formal-analysis",
        "Formal analysis",
        "Application of statistical, mathematical, computational, or other formal techniques to "
        "analyze or synthesize study data.",
    ),
    CreditRole(
        "funding-acquisition",
        "Funding acquisition",
        "Acquisition of the financial support for the project leading to this publication.",
    ),
    CreditRole(
        "investigation",
        "Investigation",
        "Conducting a research and investigation process, specifically performing the "
        "experiments, or data/evidence collection.",
    ),
    CreditRole(
        "methodology",
        "Methodology",
        "Development or design of methodology; creation of models.",
    ),
    CreditRole(
        "project-administration",
        "Project administration",
        "Management and coordination responsibility for the research activity planning and "
        "execution.",
    ),
    CreditRole(
        "resources",
        "Resources",
        "Provision of study materials, reagents, materials, patients, laboratory samples, "
        "animals, instrumentation, computing resources, or other analysis tools.",
    ),
    CreditRole(
        "software",
        "Software",
        "Programming, software development; designing computer programs; implementation of the "
        "computer code and supporting algorithms; testing of existing code components.",
    ),
    CreditRole(
        "supervision",
        "Supervision",
        "Oversight and leadership responsibility for the research activity planning and "
        "execution, including mentorship external to the core team.",
    ),
    CreditRole(
        "validation",
        "Validation",
        "Verification, whether as a part of the activity or separate, of the overall "
        "replication/reproducibility of results/experiments and other research outputs.",
    ),
    CreditRole(
        "visualization",
        "Visualization",
        "Preparation, creation and/or presentation of the published work, specifically "
        "visualization/data presentation.",
    ),
    CreditRole(
        "writing-original-draft",
        "Writing \u2013 original draft",
        "Preparation, creation and/or presentation of the published work, specifically writing "
        "the initial draft (including substantive translation).",
    ),
    CreditRole(
        "writing-review-editing",
        "Writing \u2013 review & editing",
        "Preparation, creation and/or presentation of the published work by those from the "
        "original research group, specifically critical review, commentary or revision "
        "\u2013 including pre- or post-publication stages.",
    ),
)

ROLES_BY_SLUG: dict[str, CreditRole] = {r.slug: r for r in ROLES}
_ORDER = {r.slug: i for i, r in enumerate(ROLES)}

# Defaults of a draft statement (accounting.services.credit.credit_statement_draft).
DATA_PROVIDER_ROLES = ("data-curation", "resources")
SUBMITTER_ROLES = ("investigation", "methodology", "software")
PI_ROLES = ("project-administration", "supervision")

# What a share was measured by (``CreditContributor.share_method``), as the paragraph names it.
SHARE_BASIS = {
    "exact": "exact Shapley value over the whole run",
    "gtg": "GTG-Shapley value over the whole run",
    "data_volume": "data volume (training examples, from the row counts as released), as no "
    "coalition model could be rebuilt or sent "
    "(secure aggregation hides individual updates; bagged trees, ADR 0023; a data steward had not "
    "opted in to Shapley values, ADR 0036)",
    "pi": "set by the principal investigator",
}
SHARE_BASIS_ORDER = ("exact", "gtg", "data_volume", "pi")


def role(slug: str) -> CreditRole:
    """The role with ``slug``; raises ``UnknownRole`` for anything else."""
    try:
        return ROLES_BY_SLUG[slug]
    except (KeyError, TypeError):
        raise UnknownRole(f"{slug!r} is not a CRediT role") from None


def normalise_roles(slugs: Iterable[str]) -> list[str]:
    """``slugs`` without duplicates, in the standard's order; raises ``UnknownRole`` on any
    unknown slug (naming the first)."""
    unique = set()
    for slug in slugs:
        role(slug)
        unique.add(slug)
    return sorted(unique, key=_ORDER.__getitem__)


def format_share(share: float | None) -> str:
    """A share in [0, 1] as a whole percentage with a space before the sign: ``0.4246 -> "42 %"``.

    Rounds half up (0.425 -> "43 %", independent of binary floating point: the share goes through
    its shortest decimal repr first). A positive share that rounds to 0 is ``"<1 %"``; ``None`` is
    ``""``.
    """
    if share is None:
        return ""
    percent = (Decimal(repr(float(share))) * 100).quantize(Decimal(1), rounding=ROUND_HALF_UP)
    if percent == 0 and share > 0:
        return "<1 %"
    return f"{percent} %"


@dataclass(frozen=True)
class Contributor:
    """One line of a statement: a ``kind`` ``"person"`` or ``"institution"``, role slugs, and a
    contribution ``share`` in [0, 1] (``None``: not measured) with the ``share_method`` it came
    from (a key of ``SHARE_BASIS``, or ``""``)."""

    name: str
    kind: str = PERSON
    roles: tuple[str, ...] = ()
    share: float | None = None
    share_method: str = ""

    def role_objects(self) -> list[CreditRole]:
        """The contributor's roles in the standard's order (unknown slugs raise ``UnknownRole``)."""
        return [role(s) for s in normalise_roles(self.roles)]


def share_note(contributors: Sequence[Contributor]) -> str:
    """The sentence that says what the percentages mean, or which data providers lack one.

    Empty when nobody has a share and nobody provides data. Examples: ``"Percentages are
    contribution shares (exact Shapley value over the whole run)."``; ``"Contribution shares are
    not measured yet."``.
    """
    methods = {c.share_method for c in contributors if c.share is not None}
    bases = [SHARE_BASIS[m] for m in SHARE_BASIS_ORDER if m in methods]
    unmeasured = [c.name for c in contributors if "data-curation" in c.roles and c.share is None]
    sentences = []
    if methods:
        basis = f" ({'; '.join(bases)})" if bases else ""
        sentences.append(f"Percentages are contribution shares{basis}.")
        if unmeasured:
            sentences.append(f"No contribution share is measured for {', '.join(unmeasured)}.")
    elif unmeasured:
        sentences.append("Contribution shares are not measured yet.")
    return " ".join(sentences)


def contribution_paragraph(contributors: Sequence[Contributor], *, note: bool = True) -> str:
    """The contribution section of a paper, one sentence per role that someone holds.

    Roles come in the standard's order; within a role, contributors come in the given order (the
    statement's positions) and a contributor with a share gets it in brackets:
    ``"Data curation: Hospital A (42 %), Hospital B (35 %). Investigation: Ada Lovelace."``.
    With ``note`` the ``share_note`` sentence follows. Unknown role slugs raise ``UnknownRole``;
    an empty statement gives ``""``.
    """
    by_role: dict[str, list[str]] = {}
    for c in contributors:
        label = f"{c.name} ({format_share(c.share)})" if c.share is not None else c.name
        for slug in normalise_roles(c.roles):
            by_role.setdefault(slug, []).append(label)
    sentences = [f"{r.name}: {', '.join(by_role[r.slug])}." for r in ROLES if r.slug in by_role]
    if note:
        extra = share_note(contributors)
        if extra:
            sentences.append(extra)
    return " ".join(sentences)


def method_lines(method: Mapping | None) -> list[tuple[str, str]]:
    """How the job was trained and credited, as ``(label, text)`` lines for the statement page
    and its text export, from a method document (``federation.method.method_document`` plus
    ``"contribution"``, see :func:`statement_document`); ``[]`` for ``None``.

    Labels, in order: Model, Strategy, Training, Differential privacy, Secure aggregation,
    Contribution method (the last only when the document has one). Example lines::

        ("Strategy", "FedProx (μ = 0.1)")
        ("Differential privacy", "ε = 2.91 at δ = 1e-5, server-side fixed clipping")  # or "off"
        ("Secure aggregation", "SecAgg+")                                             # or "off"
    """
    if not method:
        return []
    privacy = method.get("privacy")
    lines = [
        ("Model", method["model"]["description"]),
        ("Strategy", method["strategy"]["description"]),
        ("Training", method["training"]["description"]),
        ("Differential privacy", privacy["description"] if privacy else "off"),
        ("Secure aggregation", SECAGG_LABEL if method.get("secure_aggregation") else "off"),
    ]
    contribution = method.get("contribution")
    if contribution:
        lines.append(("Contribution method", contribution["description"]))
    return lines


def statement_text(paragraph: str, method: Mapping | None) -> str:
    """The text export: the paper paragraph, a blank line, then one ``"Label: text"`` line per
    :func:`method_lines` entry (ends with a newline; only the paragraph when ``method`` is
    ``None``)."""
    lines = [paragraph]
    method_text = [f"{label}: {text}" for label, text in method_lines(method)]
    if method_text:
        lines += ["", *method_text]
    return "\n".join(lines) + "\n"


def statement_document(
    *,
    job: dict,
    project: dict,
    contributors: Sequence[Contributor],
    method: Mapping | None = None,
    **meta,
) -> dict:
    """The JSON document of a statement (schema ``frp-credit/1``).

    Shape::

        {"schema": "frp-credit/1", "standard": "ANSI/NISO Z39.104-2022",
         "job": {...as given: id, title, status}, "project": {...as given: slug, title},
         "method": {...as given, or None: model, strategy, training, privacy,
                    secure_aggregation, contribution — see below},
         **meta (e.g. edited, edited_by, updated_at),
         "contributors": [{"position": 1, "name": str, "kind": "person"|"institution",
                           "roles": [{"slug", "name", "uri"}, ...],   # the standard's order
                           "share": float in [0, 1] | None, "share_method": str | None}],
         "share_note": str, "paragraph": str}

    ``method`` (``federation.method.method_document`` with the contribution basis)::

        {"task": str,
         "model": {"kind": str, "params": {...}, "description": str},
         "strategy": {"name": str, "params": {...}, "description": str},
         "training": {"rounds": int, "local_epochs": int | None, "learning_rate": float | None,
                      "description": str},
         "privacy": {"mode": "server" | "client", "epsilon": float, "delta": float,
                     "noise_multiplier": float, "clipping_norm": float,
                     "description": str} | None,
         "secure_aggregation": bool,
         "contribution": {"method": "exact" | "gtg" | "data_volume", "measured": bool,
                          "reason": str, "description": str}}

    ``position`` counts from 1 in the given order. Raises ``UnknownRole`` on an unknown slug.
    """
    return {
        "schema": "frp-credit/1",
        "standard": STANDARD,
        "job": job,
        "project": project,
        "method": dict(method) if method is not None else None,
        **meta,
        "contributors": [
            {
                "position": i,
                "name": c.name,
                "kind": c.kind,
                "roles": [r.as_dict() for r in c.role_objects()],
                "share": c.share,
                "share_method": c.share_method or None,
            }
            for i, c in enumerate(contributors, start=1)
        ],
        "share_note": share_note(contributors),
        "paragraph": contribution_paragraph(contributors),
    }
