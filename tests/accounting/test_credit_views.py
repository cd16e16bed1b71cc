"""Credit pages through the Django test client: who sees the statement, who edits it, the edit form's
inline errors, the JSON and paragraph exports (checked against text written out by hand), and the
card on the job page."""

from __future__ import annotations

import html
import json
import re

import pytest
from django.test import Client

from accounting.models import ContributionScore, CreditStatement
from accounting.services.credit import credit_statement_draft
from portal.models import AuditEvent
from tests.accounting.credit_world import build_credit_world, score

pytestmark = pytest.mark.django_db

EVERYONE = ["ada", "grace", "alan", "olga", "bea", "uma", "ian", "root"]
READERS = {"ada", "grace", "alan", "bea", "uma", "root"}

EXPECTED_PARAGRAPH = (
    "Data curation: Hospital B (42 %), Hospital C (35 %), Hospital A (23 %). "
    "Investigation: Ada Lovelace. "
    "Methodology: Ada Lovelace. "
    "Project administration: Grace Hopper. "
    "Resources: Hospital B (42 %), Hospital C (35 %), Hospital A (23 %). "
    "Software: Ada Lovelace. "
    "Supervision: Grace Hopper. "
    "Percentages are contribution shares (exact Shapley value over the whole run)."
)


# How the world's job (linear model, FedAvg, no DP, no SecAgg+, exact Shapley over 3 sites) was
# trained and credited: the text export's lines after the paragraph, and the JSON's "method".
EXACT_BASIS = (
    "exact Shapley value over the whole run, because each coalition's model could be rebuilt "
    "from the sites' logged updates and 3 sites (at most 8) let every coalition be scored"
)
EXPECTED_METHOD_TEXT = (
    "Model: logistic (softmax) regression\n"
    "Strategy: FedAvg\n"
    "Training: 5 rounds, 5 local epochs, site learning rate 0.1\n"
    "Differential privacy: off\n"
    "Secure aggregation: off\n"
    f"Contribution method: {EXACT_BASIS}\n"
)
EXPECTED_METHOD = {
    "task": "classification",
    "model": {"kind": "linear", "params": {}, "description": "logistic (softmax) regression"},
    "strategy": {"name": "fedavg", "params": {}, "description": "FedAvg"},
    "training": {
        "rounds": 5,
        "local_epochs": 5,
        "learning_rate": 0.1,
        "description": "5 rounds, 5 local epochs, site learning rate 0.1",
    },
    "privacy": None,
    "secure_aggregation": False,
    "contribution": {
        "method": "exact",
        "measured": True,
        "reason": "all_coalitions",
        "description": EXACT_BASIS,
    },
}


def _role(slug: str, name: str) -> dict:
    return {"slug": slug, "name": name, "uri": f"https://credit.niso.org/contributor-roles/{slug}/"}


DATA_ROLES = [_role("data-curation", "Data curation"), _role("resources", "Resources")]


@pytest.fixture
def world():
    world = build_credit_world()
    for k, share in {"A": 0.23, "B": 0.42, "C": 0.35}.items():
        score(world.job, world.sites[k], share)
    return world


def _client(world, who: str) -> Client:
    client = Client()
    client.force_login(world.users[who])
    return client


def _url(world, suffix: str = "") -> str:
    return f"/accounting/credit/jobs/{world.job.pk}/{suffix}"


def _text(response) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", response.content.decode())))


# ---------------------------------------------------------------------------------------------
# Who sees what
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("who", EVERYONE)
@pytest.mark.parametrize("suffix", ["", "credit.json", "credit.txt"])
def test_statement_and_exports_readers_only(world, who, suffix):
    response = _client(world, who).get(_url(world, suffix))

    assert response.status_code == (200 if who in READERS else 404)


@pytest.mark.parametrize("suffix", ["", "credit.json", "credit.txt", "edit/"])
def test_statement_anonymous_goes_to_sign_in(world, suffix):
    response = Client().get(_url(world, suffix))

    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


@pytest.mark.parametrize("who", EVERYONE)
def test_edit_page_pi_only_others_403_or_404(world, who):
    credit_statement_draft(job=world.job)

    response = _client(world, who).get(_url(world, "edit/"))

    expected = 200 if who == "grace" else 403 if who in READERS else 404
    assert response.status_code == expected


@pytest.mark.parametrize("who", ["ada", "alan", "bea", "root"])
def test_edit_post_by_non_pi_403_nothing_changes(world, who):
    statement = credit_statement_draft(job=world.job)
    data = _form_data(statement)
    data["c-0-name"] = "Someone Else"

    response = _client(world, who).post(_url(world, "edit/"), data)

    assert response.status_code == 403
    assert statement.contributors.filter(name="Someone Else").count() == 0
    assert not AuditEvent.objects.filter(action="credit.edit").exists()


@pytest.mark.parametrize("who", ["ada", "bea"])
def test_draft_post_by_non_pi_403(world, who):
    response = _client(world, who).post(_url(world, "draft/"))

    assert response.status_code == 403
    assert not CreditStatement.objects.exists()


# ---------------------------------------------------------------------------------------------
# The statement page and exports
# ---------------------------------------------------------------------------------------------


def test_statement_page_preview_shows_draft_and_edit_for_pi(world):
    response = _client(world, "grace").get(_url(world))

    page = _text(response)
    assert "Preview: the draft the job gets from its data today" in page
    assert EXPECTED_PARAGRAPH in page
    assert "Hospital B Institution Data curation Resources 42 % Exact Shapley" in page
    assert f'action="{_url(world, "draft/")}"' in response.content.decode()
    assert not CreditStatement.objects.exists()  # reading writes nothing


def test_statement_page_member_has_no_edit_button(world):
    credit_statement_draft(job=world.job)

    response = _client(world, "ada").get(_url(world))

    assert "Edit statement" not in response.content.decode()
    assert "Draft from the job's data" in _text(response)


def test_statement_page_role_badges_link_to_term_uris(world):
    content = _client(world, "ada").get(_url(world)).content.decode()

    badges = re.findall(r'href="([^"]+)"[^>]*data-role="([^"]+)"', content)
    assert (
        "https://credit.niso.org/contributor-roles/project-administration/",
        "project-administration",
    ) in badges
    assert len(badges) == 3 + 2 + 3 * 2  # Ada 3 roles, Grace 2, three hospitals 2 each


def test_paragraph_export_is_the_hand_written_text(world):
    credit_statement_draft(job=world.job)

    response = _client(world, "bea").get(_url(world, "credit.txt"))

    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response.content.decode() == EXPECTED_PARAGRAPH + "\n\n" + EXPECTED_METHOD_TEXT


def test_json_export_is_the_hand_written_document(world):
    credit_statement_draft(job=world.job)

    response = _client(world, "uma").get(_url(world, "credit.json"))

    assert response["Content-Type"] == "application/json; charset=utf-8"
    assert json.loads(response.content) == {
        "schema": "frp-credit/1",
        "standard": "ANSI/NISO Z39.104-2022",
        "job": {"id": world.job.pk, "title": "Risk model v1", "status": "completed"},
        "project": {"slug": "cardio", "title": "Cardio risk"},
        "method": EXPECTED_METHOD,
        "state": "draft",
        "edited_by": None,
        "edited_at": None,
        "footprint": None,  # no usage recorded
        "contributors": [
            {
                "position": 1,
                "name": "Ada Lovelace",
                "kind": "person",
                "roles": [
                    _role("investigation", "Investigation"),
                    _role("methodology", "Methodology"),
                    _role("software", "Software"),
                ],
                "share": None,
                "share_method": None,
            },
            {
                "position": 2,
                "name": "Grace Hopper",
                "kind": "person",
                "roles": [
                    _role("project-administration", "Project administration"),
                    _role("supervision", "Supervision"),
                ],
                "share": None,
                "share_method": None,
            },
            {
                "position": 3,
                "name": "Hospital B",
                "kind": "institution",
                "roles": DATA_ROLES,
                "share": 0.42,
                "share_method": "exact",
            },
            {
                "position": 4,
                "name": "Hospital C",
                "kind": "institution",
                "roles": DATA_ROLES,
                "share": 0.35,
                "share_method": "exact",
            },
            {
                "position": 5,
                "name": "Hospital A",
                "kind": "institution",
                "roles": DATA_ROLES,
                "share": 0.23,
                "share_method": "exact",
            },
        ],
        "share_note": "Percentages are contribution shares (exact Shapley value over the whole run).",
        "paragraph": EXPECTED_PARAGRAPH,
    }


# ---------------------------------------------------------------------------------------------
# Editing
# ---------------------------------------------------------------------------------------------


def _form_data(statement, extra: int = 2) -> dict:
    """The edit form as the page fills it in for ``statement`` (plus ``extra`` blank rows)."""
    rows = list(statement.contributors.order_by("position"))
    data = {
        "c-TOTAL_FORMS": str(len(rows) + extra),
        "c-INITIAL_FORMS": str(len(rows)),
        "c-MIN_NUM_FORMS": "0",
        "c-MAX_NUM_FORMS": "60",
    }
    for i, c in enumerate(rows):
        data[f"c-{i}-id"] = str(c.pk)
        data[f"c-{i}-name"] = c.name
        data[f"c-{i}-kind"] = c.kind
        data[f"c-{i}-roles"] = list(c.roles)
        data[f"c-{i}-share"] = "" if c.share is None else f"{c.share * 100:.2f}"
    for i in range(len(rows), len(rows) + extra):
        data[f"c-{i}-id"] = ""
        data[f"c-{i}-name"] = ""
        data[f"c-{i}-kind"] = "person"
        data[f"c-{i}-share"] = ""
    return data


def test_draft_post_by_pi_stores_and_opens_edit_page(world):
    client = _client(world, "grace")

    response = client.post(_url(world, "draft/"))

    assert response.status_code == 302 and response["Location"] == _url(world, "edit/")
    page = client.get(_url(world, "edit/"))
    assert page.status_code == 200
    content = page.content.decode()
    assert content.count('type="checkbox" name="c-0-roles"') == 14
    assert 'name="c-2-share" id="id_c-2-share" value="42.00"' in content
    template = content[content.index('<template id="empty-row">') :]
    assert 'name="c-__prefix__-name"' in template.split("</template>")[0]


def test_edit_page_without_statement_sends_pi_back(world):
    response = _client(world, "grace").get(_url(world, "edit/"))

    assert response.status_code == 302 and response["Location"] == _url(world)


def test_edit_post_by_pi_saves_and_paragraph_follows(world):
    statement = credit_statement_draft(job=world.job)
    data = _form_data(statement)
    data["c-1-roles"] = ["conceptualization", "supervision", "writing-original-draft"]
    data["c-4-DELETE"] = "on"  # Hospital A
    data["c-5-name"] = "Alan Turing"
    data["c-5-roles"] = ["formal-analysis", "writing-review-editing"]
    client = _client(world, "grace")

    response = client.post(_url(world, "edit/"), data)

    assert response.status_code == 302 and response["Location"] == _url(world)
    assert client.get(_url(world, "credit.txt")).content.decode() == (
        "Conceptualization: Grace Hopper. "
        "Data curation: Hospital B (42 %), Hospital C (35 %). "
        "Formal analysis: Alan Turing. "
        "Investigation: Ada Lovelace. "
        "Methodology: Ada Lovelace. "
        "Resources: Hospital B (42 %), Hospital C (35 %). "
        "Software: Ada Lovelace. "
        "Supervision: Grace Hopper. "
        "Writing \u2013 original draft: Grace Hopper. "
        "Writing \u2013 review & editing: Alan Turing. "
        "Percentages are contribution shares (exact Shapley value over the whole run).\n"
        "\n" + EXPECTED_METHOD_TEXT
    )
    statement.refresh_from_db()
    assert statement.edited_by == world.users["grace"]
    # shares left as shown keep their stored value and method
    assert list(statement.contributors.values_list("share", "share_method"))[2:4] == [
        (0.42, "exact"),
        (0.35, "exact"),
    ]
    page = _text(client.get(_url(world)))
    assert "Edited by Grace Hopper on" in page


def test_edit_post_unchanged_share_keeps_its_exact_value(world):
    ContributionScore.objects.filter(job=world.job, site=world.sites["B"]).update(share=0.414637)
    statement = credit_statement_draft(job=world.job)
    data = _form_data(statement)
    assert data["c-2-share"] == "41.46"  # what the page shows
    data["c-0-roles"] = ["software"]

    response = _client(world, "grace").post(_url(world, "edit/"), data)

    assert response.status_code == 302
    b = statement.contributors.get(name="Hospital B")
    assert (b.share, b.share_method) == (0.414637, "exact")


def test_edit_post_changed_share_marked_as_set_by_pi(world):
    statement = credit_statement_draft(job=world.job)
    data = _form_data(statement)
    data["c-2-share"] = "40.5"

    _client(world, "grace").post(_url(world, "edit/"), data)

    b = statement.contributors.get(name="Hospital B")
    assert (b.share, b.share_method) == (0.405, "pi")
    assert "Set by the PI" in _text(_client(world, "ada").get(_url(world)))


def test_edit_post_errors_inline_nothing_saved(world):
    statement = credit_statement_draft(job=world.job)
    data = _form_data(statement)
    data["c-0-roles"] = []
    data["c-2-share"] = "140"
    data["c-5-name"] = "Half filled"  # a new row without roles

    response = _client(world, "grace").post(_url(world, "edit/"), data)

    assert response.status_code == 200
    content = response.content.decode()
    rows = re.split(r'data-row="', content)[1:]
    assert "Choose at least one role." in rows[0]
    assert "Ensure this value is less than or equal to 100." in rows[2]
    assert "Choose at least one role." in rows[5]
    assert "Choose at least one role." not in rows[1]
    statement.refresh_from_db()
    assert statement.edited_at is None


def test_edit_post_service_errors_shown(world):
    statement = credit_statement_draft(job=world.job)
    data = _form_data(statement)
    data["c-0-share"] = "30"  # 30 + 42 + 35 + 23 = 130 %
    data["c-3-name"] = "hospital b"

    response = _client(world, "grace").post(_url(world, "edit/"), data)

    content = html.unescape(response.content.decode())
    assert response.status_code == 200
    assert "Already listed in row 3." in re.split(r'data-row="', content)[4]
    data["c-3-name"] = "Hospital C"
    response = _client(world, "grace").post(_url(world, "edit/"), data)
    assert "The shares add up to 130.0 %; at most 100 %." in html.unescape(
        response.content.decode()
    )
    assert not AuditEvent.objects.filter(action="credit.edit").exists()


# ---------------------------------------------------------------------------------------------
# The job page
# ---------------------------------------------------------------------------------------------


def test_job_page_shows_credit_card(world):
    credit_statement_draft(job=world.job)

    response = _client(world, "alan").get(f"/jobs/{world.job.pk}/")

    content = response.content.decode()
    assert response.status_code == 200
    card = content[content.index('id="credit"') :]
    assert f'href="{_url(world)}"' in card
    text = _text_of(card)
    assert "Ada Lovelace Investigation Methodology Software" in text
    assert "Hospital B 42 % Data curation Resources" in text


def _text_of(fragment: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", fragment)))


def test_statement_shows_energy_and_emissions_per_site_summed_over_runs(world):
    from tests.factories import BillingUsageFactory

    # Hospital A's site ran twice (the job was resumed): 0.5 + 0.25 = 0.75 kWh, 100 + 50 = 150 g;
    # B once: 1.0 kWh, 200 g; C has no usage record. Total 1.75 kWh, 350 g.
    for site, run, kwh, grams in (("A", 1, 0.5, 100.0), ("A", 2, 0.25, 50.0), ("B", 1, 1.0, 200.0)):
        BillingUsageFactory(
            job=world.job, site=world.sites[site], run=run, energy_kwh=kwh, emissions_g=grams
        )
    client = _client(world, "uma")

    doc = json.loads(client.get(_url(world, "credit.json")).content)
    assert doc["footprint"] == {
        "sites": [
            {
                "site": "site-a",
                "institution": "Hospital A",
                "energy_kwh": 0.75,
                "emissions_g": 150.0,
            },
            {
                "site": "site-b",
                "institution": "Hospital B",
                "energy_kwh": 1.0,
                "emissions_g": 200.0,
            },
        ],
        "energy_kwh": 1.75,
        "emissions_g": 350.0,
    }
    page = _text(client.get(_url(world)))
    assert "Energy and emissions" in page
    assert "site-a Hospital A 0.750 kWh 150 gCO2e" in page
    assert "Total 1.750 kWh 350 gCO2e" in page
    text = client.get(_url(world, "credit.txt")).content.decode()
    assert text.endswith(
        "Energy and emissions: 1.750 kWh, 350 gCO2e "
        "(site-a 0.750 kWh, 150 gCO2e; site-b 1.000 kWh, 200 gCO2e)\n"
    )


def test_edit_post_two_rows_of_one_contributor_refused_and_said(world):
    """Hostile re-test F5: a second row carrying the first row's id overwrote it, and the
    contributor it had replaced vanished from the statement; now refused, said on the row."""
    statement = credit_statement_draft(job=world.job)
    before = list(statement.contributors.order_by("position").values_list("pk", "name"))
    data = _form_data(statement)
    data["c-1-id"] = data["c-0-id"]

    response = _client(world, "grace").post(_url(world, "edit/"), data)

    assert response.status_code == 200
    content = html.unescape(response.content.decode())
    assert "The same contributor as row 1: reload the page." in re.split(r'data-row="', content)[2]
    assert list(statement.contributors.order_by("position").values_list("pk", "name")) == before
