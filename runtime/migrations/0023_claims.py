"""Who is working on what (issue 39): a person holds an approval request or an unresolved
operation; one holder per item is the table's unique key."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runtime', '0022_task_updates_hot'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='Claim',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('queue', models.CharField(choices=[('approvals', 'approvals'), ('unresolved', 'unresolved')], max_length=16)),
                ('taken_at', models.DateTimeField()),
                ('given_by', models.CharField(blank=True, default='', max_length=200)),
                ('holder', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='claims', to=settings.AUTH_USER_MODEL)),
                ('operation', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='claims', to='runtime.operation')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('operation', 'queue'), name='claim_one_holder_per_item'), models.CheckConstraint(condition=models.Q(('queue__in', ('approvals', 'unresolved'))), name='claim_queue_valid')],
            },
        ),
    ]
