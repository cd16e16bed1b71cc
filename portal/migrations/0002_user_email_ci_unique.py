"""E-mail addresses are unique regardless of case (identity never rests on e-mail, but no two
accounts may claim one address). An expression index on auth_user, valid on PostgreSQL and SQLite."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [
        migrations.RunSQL(
            sql="CREATE UNIQUE INDEX user_email_ci_unique ON auth_user (LOWER(email)) WHERE email <> ''",
            reverse_sql="DROP INDEX user_email_ci_unique",
        )
    ]
