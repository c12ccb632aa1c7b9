from __future__ import annotations

from django.conf import settings
from django.db import models


class SavedView(models.Model):
    """A person's named filter of a console list (its query string, keys checked against the
    page's filters when saved): the views a person on shift opens first."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    page = models.CharField(max_length=20)
    name = models.CharField(max_length=80)
    query = models.CharField(max_length=1000)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "page", "name"], name="saved_view_name_once"),
        ]
