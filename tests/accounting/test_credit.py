"""The CRediT module without Django: the 14 roles of ANSI/NISO Z39.104-2022, share format, paragraph,
JSON document. Expected values are written out by hand from the standard's term list
(https://credit.niso.org/contributor-roles-defined/)."""

from __future__ import annotations

import pytest

from accounting import credit
from accounting.credit import Contributor, UnknownRole

# The standard's 14 terms, in its order, with the slug of each term URI.
STANDARD_TERMS = [
    ("Conceptualization", "conceptualization"),
    ("Data curation", "data-curation"),
    ("Formal analysis", "formal-analysis"),
    ("Funding acquisition", "funding-acquisition"),
    ("Investigation", "investigation"),
    ("Methodology", "methodology"),
    ("Project administration", "project-administration"),
    ("Resources", "resources"),
    ("Software", "software"),
    ("Supervision", "supervision"),
    ("Validation", "validation"),
    ("Visualization", "visualization"),
    ("Writing \u2013 original draft", "writing-original-draft"),
    ("Writing \u2013 review & editing", "writing-review-editing"),
]


def test_roles_are_the_14_of_the_standard_with_exact_names():
    assert [(r.name, r.slug) for r in credit.ROLES] == STANDARD_TERMS


def test_roles_writing_names_use_an_en_dash():
    names = {r.slug: r.name for r in credit.ROLES}

    assert names["writing-original-draft"].encode() == b"Writing \xe2\x80\x93 original draft"
    assert names["writing-review-editing"].encode() == b"Writing \xe2\x80\x93 review & editing"


def test_roles_uri_is_the_niso_term_page():
    assert credit.role("data-curation").uri == (
        "https://credit.niso.org/contributor-roles/data-curation/"
    )
    assert credit.role("writing-review-editing").as_dict() == {
        "slug": "writing-review-editing",
        "name": "Writing \u2013 review & editing",
        "uri": "https://credit.niso.org/contributor-roles/writing-review-editing/",
    }


def test_roles_definitions_match_the_standard():
    assert credit.role("methodology").definition == (
        "Development or design of methodology; creation of models."
    )
    assert credit.role("conceptualization").definition == (
        "Ideas; formulation or evolution of overarching research goals and aims."
    )
    assert all(r.definition.endswith(".") for r in credit.ROLES)


@pytest.mark.parametrize("slug", ["Data curation", "data_curation", "", None, "writing"])
def test_role_unknown_slug_raises(slug):
    with pytest.raises(UnknownRole):
        credit.role(slug)


def test_normalise_roles_orders_by_standard_and_drops_duplicates():
    assert credit.normalise_roles(["supervision", "data-curation", "supervision"]) == [
        "data-curation",
        "supervision",
    ]


def test_normalise_roles_unknown_raises_naming_it():
    with pytest.raises(UnknownRole, match="'authorship'"):
        credit.normalise_roles(["software", "authorship"])


@pytest.mark.parametrize(
    ("share", "text"),
    [
        (0.42, "42 %"),
        (0.4246, "42 %"),
        (0.425, "43 %"),  # half up, although 0.425 is 0.42499999… in binary
        (0.995, "100 %"),
        (1.0, "100 %"),
        (0.0, "0 %"),
        (0.004, "<1 %"),
        (None, ""),
    ],
)
def test_format_share(share, text):
    assert credit.format_share(share) == text


DRAFT = [
    Contributor("Ada Lovelace", "person", ("software", "methodology", "investigation")),
    Contributor("Grace Hopper", "person", ("supervision", "project-administration")),
    Contributor("Hospital B", "institution", ("data-curation", "resources"), 0.42, "exact"),
    Contributor("Hospital C", "institution", ("data-curation", "resources"), 0.35, "exact"),
    Contributor("Hospital A", "institution", ("data-curation", "resources"), 0.23, "exact"),
]


def test_paragraph_roles_in_standard_order_names_in_given_order():
    assert credit.contribution_paragraph(DRAFT) == (
        "Data curation: Hospital B (42 %), Hospital C (35 %), Hospital A (23 %). "
        "Investigation: Ada Lovelace. "
        "Methodology: Ada Lovelace. "
        "Project administration: Grace Hopper. "
        "Resources: Hospital B (42 %), Hospital C (35 %), Hospital A (23 %). "
        "Software: Ada Lovelace. "
        "Supervision: Grace Hopper. "
        "Percentages are contribution shares (exact Shapley value over the whole run)."
    )


def test_paragraph_without_note():
    people = [
        Contributor("A", roles=("conceptualization",)),
        Contributor("B", roles=("conceptualization", "validation")),
    ]

    assert credit.contribution_paragraph(people, note=False) == (
        "Conceptualization: A, B. Validation: B."
    )


def test_paragraph_unmeasured_shares_say_so():
    contributors = [
        Contributor("Ada Lovelace", roles=("software",)),
        Contributor("Hospital A", "institution", ("data-curation", "resources")),
    ]

    assert credit.contribution_paragraph(contributors) == (
        "Data curation: Hospital A. Resources: Hospital A. Software: Ada Lovelace. "
        "Contribution shares are not measured yet."
    )


def test_share_note_partly_measured_names_the_missing():
    contributors = [
        Contributor("Hospital A", "institution", ("data-curation",), 0.6, "gtg"),
        Contributor("Hospital B", "institution", ("data-curation",), 0.4, "pi"),
        Contributor("Hospital C", "institution", ("data-curation",)),
    ]

    assert credit.share_note(contributors) == (
        "Percentages are contribution shares (GTG-Shapley value over the whole run; "
        "set by the principal investigator). No contribution share is measured for Hospital C."
    )


def test_paragraph_empty_statement_is_empty():
    assert credit.contribution_paragraph([]) == ""


def test_paragraph_unknown_role_raises():
    with pytest.raises(UnknownRole):
        credit.contribution_paragraph([Contributor("A", roles=("typing",))])


def test_statement_document_shape():
    doc = credit.statement_document(
        job={"id": 7, "title": "Risk", "status": "completed"},
        project={"slug": "cardio", "title": "Cardio"},
        contributors=DRAFT[1:3],
        state="draft",
    )

    assert doc == {
        "schema": "frp-credit/1",
        "standard": "ANSI/NISO Z39.104-2022",
        "job": {"id": 7, "title": "Risk", "status": "completed"},
        "project": {"slug": "cardio", "title": "Cardio"},
        "method": None,
        "state": "draft",
        "contributors": [
            {
                "position": 1,
                "name": "Grace Hopper",
                "kind": "person",
                "roles": [
                    {
                        "slug": "project-administration",
                        "name": "Project administration",
                        "uri": "https://credit.niso.org/contributor-roles/project-administration/",
                    },
                    {
                        "slug": "supervision",
                        "name": "Supervision",
                        "uri": "https://credit.niso.org/contributor-roles/supervision/",
                    },
                ],
                "share": None,
                "share_method": None,
            },
            {
                "position": 2,
                "name": "Hospital B",
                "kind": "institution",
                "roles": [
                    {
                        "slug": "data-curation",
                        "name": "Data curation",
                        "uri": "https://credit.niso.org/contributor-roles/data-curation/",
                    },
                    {
                        "slug": "resources",
                        "name": "Resources",
                        "uri": "https://credit.niso.org/contributor-roles/resources/",
                    },
                ],
                "share": 0.42,
                "share_method": "exact",
            },
        ],
        "share_note": "Percentages are contribution shares (exact Shapley value over the whole run).",
        "paragraph": "Data curation: Hospital B (42 %). Project administration: Grace Hopper. "
        "Resources: Hospital B (42 %). Supervision: Grace Hopper. "
        "Percentages are contribution shares (exact Shapley value over the whole run).",
    }


METHOD = {
    "model": {"kind": "linear", "params": {}, "description": "logistic (softmax) regression"},
    "strategy": {"name": "fedprox", "params": {"mu": 0.1}, "description": "FedProx (μ = 0.1)"},
    "training": {"description": "5 rounds, 5 local epochs, site learning rate 0.1"},
    "privacy": {"description": "ε = 2.91 at δ = 1e-5, server-side fixed clipping"},
    "secure_aggregation": False,
    "contribution": {"description": "exact Shapley value over the whole run, because …"},
}


def test_method_lines_label_each_part_in_order():
    assert credit.method_lines(METHOD) == [
        ("Model", "logistic (softmax) regression"),
        ("Strategy", "FedProx (μ = 0.1)"),
        ("Training", "5 rounds, 5 local epochs, site learning rate 0.1"),
        ("Differential privacy", "ε = 2.91 at δ = 1e-5, server-side fixed clipping"),
        ("Secure aggregation", "off"),
        ("Contribution method", "exact Shapley value over the whole run, because …"),
    ]


def test_method_lines_say_off_and_secagg():
    method = METHOD | {"privacy": None, "secure_aggregation": True}

    lines = dict(credit.method_lines(method))

    assert lines["Differential privacy"] == "off"
    assert lines["Secure aggregation"] == "SecAgg+"
    assert credit.method_lines(None) == []


def test_statement_text_is_paragraph_blank_line_then_method_lines():
    text = credit.statement_text("Investigation: Ada Lovelace.", METHOD)

    assert text == (
        "Investigation: Ada Lovelace.\n"
        "\n"
        "Model: logistic (softmax) regression\n"
        "Strategy: FedProx (μ = 0.1)\n"
        "Training: 5 rounds, 5 local epochs, site learning rate 0.1\n"
        "Differential privacy: ε = 2.91 at δ = 1e-5, server-side fixed clipping\n"
        "Secure aggregation: off\n"
        "Contribution method: exact Shapley value over the whole run, because …\n"
    )
    assert credit.statement_text("P.", None) == "P.\n"


def test_module_imports_no_django():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(credit.__file__).resolve().parents[1]
    code = "import sys, accounting.credit; print(sorted(m for m in sys.modules if 'django' in m))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )

    assert out.stdout.strip() == "[]"
