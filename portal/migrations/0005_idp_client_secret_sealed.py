"""OIDC client secrets sealed at rest (issue 9, finding 8).

The secret lives only on ``IdentityProvider.client_secret``, sealed (``portal.secretbox``:
``fernet:<token>`` under ``FRP_FIELD_KEYS``); allauth's ``SocialApp.secret`` is emptied and the
adapter hands allauth the unsealed secret in memory. Rows written before are sealed here.
"""

from django.db import migrations, models


def seal_existing(apps, schema_editor):
    from portal.secretbox import is_sealed, seal

    IdentityProvider = apps.get_model("portal", "IdentityProvider")
    SocialApp = apps.get_model("socialaccount", "SocialApp")
    for idp in IdentityProvider.objects.all():
        app = SocialApp.objects.filter(pk=idp.social_app_id).first()
        plain = idp.client_secret or (app.secret if app else "")
        if plain and not is_sealed(plain):
            idp.client_secret = seal(plain)
            idp.save(update_fields=["client_secret"])
        if app is not None and app.secret:
            app.secret = ""
            app.save(update_fields=["secret"])


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0004_ledger_append_only_sqlite"),
        ("socialaccount", "0006_alter_socialaccount_extra_data"),
    ]

    operations = [
        migrations.AlterField(
            model_name="identityprovider",
            name="client_secret",
            field=models.TextField(
                blank=True,
                help_text="Sealed (portal.secretbox): fernet:<token> under FRP_FIELD_KEYS.",
            ),
        ),
        migrations.RunPython(seal_existing, migrations.RunPython.noop, elidable=False),
    ]
