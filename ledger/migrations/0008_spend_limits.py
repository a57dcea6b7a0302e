"""Spend limits per tenant and connector per UTC day, and what each tenant spent each day
(``ledger.flow.spend``)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0007_effect_in_flight'),
    ]

    operations = [
        migrations.CreateModel(
            name='SpendDay',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('tenant', models.CharField(max_length=100)),
                ('connector', models.CharField(max_length=200)),
                ('day', models.DateField()),
                ('spent', models.DecimalField(decimal_places=6, default=0, max_digits=14)),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('tenant', 'connector', 'day'), name='spend_day_unique')],
            },
        ),
        migrations.CreateModel(
            name='SpendLimit',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('tenant', models.CharField(max_length=100)),
                ('connector', models.CharField(max_length=200)),
                ('per_day', models.DecimalField(decimal_places=6, max_digits=14)),
                ('changed_by_label', models.CharField(blank=True, default='', max_length=200)),
                ('changed_at', models.DateTimeField()),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('tenant', 'connector'), name='spend_limit_unique'), models.CheckConstraint(condition=models.Q(('per_day__gte', 0)), name='spend_limit_not_negative')],
            },
        ),
    ]
