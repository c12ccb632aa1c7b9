"""Tokens record who minted them (NULL: minted before this was recorded, shown as unknown), and
an approval records the minter of the token its request came with. Stored claim responses held
their lease token in clear: each becomes a placeholder that cannot be derived again (a replay of
such a claim answers 409 stale_lease), so no lease token stays in the database."""

from django.db import migrations, models


def _scrub_lease_tokens(apps, schema_editor):
    IdempotentRequest = apps.get_model("runtime", "IdempotentRequest")
    stored = IdempotentRequest.objects.filter(response_body__has_key="lease_token")
    for record in stored.iterator():
        body = record.response_body
        if isinstance(body, dict) and isinstance(body.get("lease_token"), str):
            # A placeholder naming no key: runtime.lease_tokens cannot derive it again.
            body["lease_token"] = {"$derived": "lease_token", "key": ""}
            IdempotentRequest.objects.filter(pk=record.pk).update(response_body=body)


class Migration(migrations.Migration):
    dependencies = [("runtime", "0012_runtime_refuse")]

    operations = [
        migrations.AddField(
            model_name="apitoken",
            name="minted_by",
            field=models.CharField(blank=True, max_length=100, null=True),
        ),
        migrations.AddField(
            model_name="approval",
            name="requester_minted_by",
            field=models.CharField(blank=True, default="", max_length=100),
        ),
        migrations.RunPython(_scrub_lease_tokens, migrations.RunPython.noop),
    ]
