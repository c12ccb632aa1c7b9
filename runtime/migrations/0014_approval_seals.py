"""Approvals carry a seal: a keyed MAC over the decision and the parameters it covers, checked
at release (runtime.approval_seal). Approvals already approved or released when this runs are
sealed from their rows as they stand: the upgrade trusts them as of this moment (they had no
stronger protection before), and from here on a change behind the application's back is
refused at release. Sealed under the keys configured when the migration runs (APPROVAL_SEAL_KEYS,
else derived from SECRET_KEY): configure the keys before migrating."""

from django.db import migrations, models

from runtime.approval_seal import approval_seal


def _seal_decided(apps, schema_editor):
    Approval = apps.get_model("runtime", "Approval")
    Operation = apps.get_model("runtime", "Operation")
    decided = Approval.objects.filter(status__in=("approved", "released")).order_by("pk")
    for approval in decided.iterator():
        params = (
            Operation.objects.filter(pk=approval.operation_id)
            .values_list("params", flat=True)
            .first()
        )
        seal = approval_seal(approval, approver=approval.decider_key, operation_params=params)
        Approval.objects.filter(pk=approval.pk).update(seal=seal)


class Migration(migrations.Migration):
    dependencies = [("runtime", "0013_token_minters_derived_lease_tokens")]

    operations = [
        migrations.AddField(
            model_name="approval",
            name="seal",
            field=models.CharField(blank=True, default="", max_length=100),
        ),
        migrations.RunPython(_seal_decided, migrations.RunPython.noop),
    ]
