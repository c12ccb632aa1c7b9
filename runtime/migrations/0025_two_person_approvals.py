"""The two-person rule (issue 39): an approval says how many distinct people must approve it
(``approvals_required``, 1 for every request made before), and each approve is a vote row,
unique per (approval, approver) so one person counts once whatever the concurrency.

An approval already approved or released has its one approver's vote written here from its
decision (``decider_key``, ``decided_by``, ``decided_at``): the release gate counts the votes and
asks each voter's right, so work approved before the upgrade releases (and retries) as before.
Its seal verifies unchanged: a one-approver seal's message is the one it always was
(runtime.approval_seal). No dialect difference: plain tables, a check and a unique constraint."""

import django.db.models.deletion
from django.db import migrations, models

DECIDED = ("approved", "released")


def votes_from_decisions(apps, schema_editor):
    Approval = apps.get_model("runtime", "Approval")
    ApprovalVote = apps.get_model("runtime", "ApprovalVote")
    decided = (
        Approval.objects.filter(status__in=DECIDED)
        .exclude(decider_key="")
        .values_list("pk", "decided_by", "decider_key", "decided_at", "created_at")
    )
    batch = []
    for pk, label, key, decided_at, created_at in decided.iterator(chunk_size=1000):
        batch.append(
            ApprovalVote(
                approval_id=pk, approver=label, approver_key=key, voted_at=decided_at or created_at
            )
        )
        if len(batch) >= 1000:
            ApprovalVote.objects.bulk_create(batch)
            batch = []
    ApprovalVote.objects.bulk_create(batch)


class Migration(migrations.Migration):
    dependencies = [
        ("runtime", "0024_saved_views"),
    ]

    operations = [
        migrations.AddField(
            model_name="approval",
            name="approvals_required",
            field=models.PositiveSmallIntegerField(default=1),
        ),
        migrations.AddConstraint(
            model_name="approval",
            constraint=models.CheckConstraint(
                condition=models.Q(("approvals_required__gte", 1), ("approvals_required__lte", 10)),
                name="approval_required_count_valid",
            ),
        ),
        migrations.CreateModel(
            name="ApprovalVote",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("approver", models.CharField(max_length=200)),
                ("approver_key", models.CharField(max_length=100)),
                ("voted_at", models.DateTimeField()),
                (
                    "approval",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="votes",
                        to="runtime.approval",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("approval", "approver_key"), name="approval_vote_once_per_person"
                    )
                ],
            },
        ),
        migrations.RunPython(votes_from_decisions, migrations.RunPython.noop),
    ]
