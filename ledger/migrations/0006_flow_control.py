"""Flow control per connector (ledger.flow): settings, shared limiter and circuit state, the
tickets of effects held back and the circuits' history; and each effect's flow key and count of
429s (columns with constant defaults: no table rewrite). The effects' new indexes are built
CONCURRENTLY by 0007."""


import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0005_effect_open_connector'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='CircuitChange',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('connector', models.CharField(max_length=200)),
                ('key', models.CharField(blank=True, default='', max_length=200)),
                ('state', models.CharField(choices=[('closed', 'closed: calls go through'), ('open', 'open: calls wait until the cool-down has passed'), ('half_open', 'half-open: one trial call is out')], max_length=20)),
                ('failures', models.PositiveIntegerField(default=0)),
                ('error', models.TextField(blank=True, default='', help_text='the failure that opened it')),
                ('at', models.DateTimeField()),
            ],
        ),
        migrations.CreateModel(
            name='ConnectorFlow',
            fields=[
                ('connector', models.CharField(max_length=200, primary_key=True, serialize=False)),
                ('rate', models.FloatField(blank=True, help_text='calls per second; empty: no rate limit', null=True)),
                ('burst', models.PositiveIntegerField(default=1, help_text='calls that may go at once after a quiet spell')),
                ('max_in_flight', models.PositiveIntegerField(blank=True, help_text='calls out at once; empty: no limit', null=True)),
                ('key_field', models.CharField(blank=True, default='', help_text='what the limits are kept per: "" one set for the connector, "tenant", or a payload field', max_length=100)),
                ('circuit_failures', models.PositiveIntegerField(default=5, help_text='consecutive retryable failures or timeouts that open the circuit; 0: no breaker')),
                ('circuit_window_seconds', models.FloatField(default=60.0)),
                ('circuit_cooldown_seconds', models.FloatField(default=30.0)),
                ('declared', models.JSONField(default=dict, help_text="the limits the connector's class declares")),
                ('changed_by_label', models.CharField(blank=True, default='', max_length=200)),
                ('changed_at', models.DateTimeField(blank=True, null=True)),
                ('paused_at', models.DateTimeField(blank=True, null=True)),
                ('paused_by_label', models.CharField(blank=True, default='', max_length=200)),
                ('paused_reason', models.TextField(blank=True, default='')),
            ],
        ),
        migrations.CreateModel(
            name='FlowBucket',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('connector', models.CharField(max_length=200)),
                ('key', models.CharField(blank=True, default='', max_length=200)),
                ('tat', models.DateTimeField(blank=True, null=True)),
                ('vtime', models.BigIntegerField(default=0)),
                ('circuit', models.CharField(choices=[('closed', 'closed: calls go through'), ('open', 'open: calls wait until the cool-down has passed'), ('half_open', 'half-open: one trial call is out')], default='closed', max_length=20)),
                ('failures', models.PositiveIntegerField(default=0, help_text='consecutive failures in the window')),
                ('first_failure_at', models.DateTimeField(blank=True, null=True)),
                ('opened_at', models.DateTimeField(blank=True, null=True)),
                ('trial_effect_id', models.BigIntegerField(blank=True, null=True)),
                ('changed_at', models.DateTimeField(blank=True, help_text="of the circuit's state", null=True)),
            ],
        ),
        migrations.CreateModel(
            name='FlowTicket',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('run_id', models.UUIDField()),
                ('connector', models.CharField(max_length=200)),
                ('key', models.CharField(blank=True, default='', max_length=200)),
                ('lane', models.CharField(blank=True, default='', max_length=100)),
                ('tag', models.BigIntegerField()),
                ('reason', models.CharField(choices=[('rate_limit', 'rate limit'), ('concurrency', 'concurrency limit'), ('paused', 'connector paused'), ('circuit_open', 'circuit open'), ('queued', 'queued behind earlier calls')], max_length=20)),
                ('state', models.CharField(choices=[('waiting', 'Waiting'), ('granted', 'Granted')], default='waiting', max_length=10)),
                ('created_at', models.DateTimeField()),
                ('granted_at', models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.AddField(
            model_name='effectrecord',
            name='flow_key',
            field=models.CharField(blank=True, db_default='', default='', max_length=200),
        ),
        migrations.AddField(
            model_name='effectrecord',
            name='throttled',
            field=models.PositiveIntegerField(db_default=0, default=0, help_text="dispatches refused by the provider's rate limit (429s; not attempts)"),
        ),
        migrations.AddIndex(
            model_name='circuitchange',
            index=models.Index(fields=['connector', '-at'], name='circuit_change_recent'),
        ),
        migrations.AddConstraint(
            model_name='connectorflow',
            constraint=models.CheckConstraint(condition=models.Q(('rate__isnull', True), ('rate__gt', 0), _connector='OR'), name='flow_rate_positive'),
        ),
        migrations.AddConstraint(
            model_name='connectorflow',
            constraint=models.CheckConstraint(condition=models.Q(('burst__gte', 1)), name='flow_burst_positive'),
        ),
        migrations.AddConstraint(
            model_name='connectorflow',
            constraint=models.CheckConstraint(condition=models.Q(('max_in_flight__isnull', True), ('max_in_flight__gte', 1), _connector='OR'), name='flow_in_flight_positive'),
        ),
        migrations.AddConstraint(
            model_name='flowbucket',
            constraint=models.UniqueConstraint(fields=('connector', 'key'), name='flow_bucket_unique'),
        ),
        migrations.AddField(
            model_name='flowticket',
            name='effect',
            field=models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='flow_ticket', to='ledger.effectrecord'),
        ),
        migrations.AddIndex(
            model_name='flowticket',
            index=models.Index(condition=models.Q(('state', 'waiting')), fields=['connector', 'key', 'tag', 'id'], name='flow_ticket_queue'),
        ),
        migrations.AddIndex(
            model_name='flowticket',
            index=models.Index(condition=models.Q(('state', 'waiting')), fields=['connector', 'key', 'lane', 'tag'], name='flow_ticket_lane'),
        ),
        migrations.AddIndex(
            model_name='flowticket',
            index=models.Index(condition=models.Q(('state', 'granted')), fields=['connector', 'key', 'granted_at'], name='flow_ticket_granted'),
        ),
        migrations.AddIndex(
            model_name='flowticket',
            index=models.Index(fields=['run_id'], name='flow_ticket_run'),
        ),
    ]
