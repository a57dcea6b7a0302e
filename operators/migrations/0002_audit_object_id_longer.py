"""An audit entry names objects by names of up to 200 characters (a workflow, a schedule) or two
of them (a spend limit: tenant/connector); 100 refused the entry, and with it the action, as a 500.
Widening a varchar does not rewrite the table (nor touch the append-only trigger)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('operators', '0001_initial'),
    ]

    operations = [
        migrations.AlterField(
            model_name='auditentry',
            name='object_id',
            field=models.CharField(max_length=400),
        ),
    ]
