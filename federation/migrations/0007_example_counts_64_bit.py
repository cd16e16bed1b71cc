"""Example counts are 64-bit, as the contract's counts (hostile re-test of issue 9, finding 7).

``frp_flwr.contract`` allows counts up to 2⁶³−1; ``RoundMetric.num_examples`` and
``SiteRoundMetric.train_examples``/``eval_examples`` were 32-bit, so a signed callback with
``train_examples = 2**31`` was a 500 (``DataError: integer out of range``) on PostgreSQL.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("federation", "0006_job_task_preprocessing")]

    operations = [
        migrations.AlterField(
            model_name="roundmetric",
            name="num_examples",
            field=models.PositiveBigIntegerField(default=0),
        ),
        migrations.AlterField(
            model_name="siteroundmetric",
            name="eval_examples",
            field=models.PositiveBigIntegerField(default=0),
        ),
        migrations.AlterField(
            model_name="siteroundmetric",
            name="train_examples",
            field=models.PositiveBigIntegerField(default=0),
        ),
    ]
