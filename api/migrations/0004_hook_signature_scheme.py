"""Standard Webhooks: a hook's signature scheme, and the secret a rotation replaced (in use until
previous_until). Every existing row was signed with the scheme used before, whose secret is not
the spec's base64: it is added as "saga-v1" (legacy), and only then does the default become
"standard" for the rows made from now on. Nothing is re-issued: a sender or receiver configured
with an old secret goes on working until someone rotates it."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('api', '0003_hook_event_id'),
    ]

    operations = [
        migrations.AddField(
            model_name='hook',
            name='previous_scheme',
            field=models.CharField(blank=True, choices=[('standard', 'Standard Webhooks (webhook-id, webhook-timestamp, webhook-signature)'), ('saga-v1', 'legacy (X-Saga-Timestamp, X-Saga-Signature)')], default='', max_length=10),
        ),
        migrations.AddField(
            model_name='hook',
            name='previous_secret',
            field=models.CharField(blank=True, default='', help_text='the secret the last rotation replaced, in use until previous_until', max_length=200),
        ),
        migrations.AddField(
            model_name='hook',
            name='previous_until',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='hook',
            name='signature_scheme',
            field=models.CharField(choices=[('standard', 'Standard Webhooks (webhook-id, webhook-timestamp, webhook-signature)'), ('saga-v1', 'legacy (X-Saga-Timestamp, X-Saga-Signature)')], default='saga-v1', help_text='how ``secret`` signs: rows made before Standard Webhooks keep the legacy scheme until rotated', max_length=10),
        ),
        migrations.AlterField(
            model_name='hook',
            name='signature_scheme',
            field=models.CharField(choices=[('standard', 'Standard Webhooks (webhook-id, webhook-timestamp, webhook-signature)'), ('saga-v1', 'legacy (X-Saga-Timestamp, X-Saga-Signature)')], default='standard', help_text='how ``secret`` signs: rows made before Standard Webhooks keep the legacy scheme until rotated', max_length=10),
        ),
    ]
