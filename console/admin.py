"""The Django admin at ``/admin/``: a read-only window on every table, for admins.

Every row here is state that only the runtime's services may change: operations, tasks,
attempts, the journal, approvals, invocations, budgets, holds, usage, the outbox, tokens,
schedules, notifications, and the accounts and roles too (changed with
``create_console_user`` and on ``/tokens/``, where the audit records who did it). A change made
here would skip the transition tables, the guarded statements, the journal and the audit, so
nothing can be added, changed or deleted, whatever the user's Django permissions, and the
admin's own password change page is gone (a password changes with ``create_console_user``): the
admin only finds a row by its id (or by the id of a row it points at) and shows it whole, less
its digests and sealed values. No query string filters, sorts or references by any other field
(a hidden one would answer, row by row, what it does not show). Text is shown as the console
shows it: every character that hides or reorders text marked (the ``visible`` filter). Who may
enter: ``runtime.policy_features.can_use_admin`` (admins); a person signed out goes to the console's
login page, anyone else signed in gets 403."""

from __future__ import annotations

from collections.abc import Callable
from functools import update_wrapper
from typing import Any

from django.apps import apps
from django.contrib import admin
from django.contrib.admin.utils import display_for_field, quote
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q, QuerySet
from django.forms.utils import pretty_name
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.template.defaultfilters import linebreaksbr
from django.urls import NoReverseMatch, URLPattern, URLResolver, reverse
from django.utils.html import format_html

from console.templatetags.visible import visible
from runtime import policy
from runtime.actors import actor_for_user
from runtime.policy_features import can_use_admin

# Apps whose every model is shown (new models appear without a line here).
APPS = ("runtime", "sandbox")
# Fields never shown: digests of secrets, seals, sealed values.
HIDDEN = ("digest", "seal", "secret", "password", "token")
# Columns of a change list beside the id: short fields, raw ids for relations (no join, no
# query per row).
LIST_COLUMNS = 7
_SHORT = (
    models.CharField,
    models.IntegerField,
    models.DateTimeField,
    models.BooleanField,
    models.ForeignKey,
)


def _hidden(field: models.Field[Any, Any]) -> bool:
    return any(word in field.name for word in HIDDEN)


def _shown(
    field: models.Field[Any, Any], model_admin: admin.ModelAdmin[Any], *, row_page: bool
) -> Callable[[models.Model], str]:
    """How ``field`` is shown, in a change list's column or on a row's page: Django's own
    rendering of the value (``display_for_field``), then every character that hides or reorders
    text marked by the console's ``visible`` filter (Django's rendering shows them raw, JSON
    included). One callable per field stands in for the field's name in ``list_display`` and
    ``readonly_fields``: Django has no other hook for how a read-only value renders. On a row's
    page a relation links to the row it points at, named as marked; in a change list it shows
    the raw id (no join, no query per row)."""
    site = model_admin.admin_site

    def show(obj: models.Model) -> str:
        empty = model_admin.get_empty_value_display()
        if field.many_to_many:
            shown: str = ", ".join(str(o) for o in getattr(obj, field.name).all())
        elif field.is_relation and row_page:
            remote = getattr(obj, field.name)
            return empty if remote is None else _link(site, remote)
        else:
            shown = display_for_field(getattr(obj, field.attname), field, empty)
        if hasattr(shown, "__html__"):  # the admin's own markup: the empty mark, a yes/no icon
            return shown
        marked = visible(shown)
        return linebreaksbr(marked) if row_page else marked

    show.__name__ = field.name  # the row's CSS class and the field's help text
    label = pretty_name(field.attname) if field.is_relation and not row_page else None
    return admin.display(
        show,
        description=label or field.verbose_name,
        ordering=None if field.many_to_many else field.attname,
    )


def _link(site: admin.AdminSite, remote: models.Model) -> str:
    """A link to ``remote``'s page in the admin, named as marked (as Django links a relation on
    a read-only page); its name alone when its model is not in the admin."""
    opts = remote._meta
    name = visible(str(remote))
    try:
        url = reverse(
            f"admin:{opts.app_label}_{opts.model_name}_change",
            args=[quote(remote.pk)],
            current_app=site.name,
        )
    except NoReverseMatch:
        return name
    return format_html('<a href="{}">{}</a>', url, name)


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Shows rows; adds, changes and deletes nothing. Search: an exact id, the row's own or one
    it points at (primary key and foreign key indexes only)."""

    actions = None
    show_full_result_count = False
    list_per_page = 50
    search_fields = ("pk",)  # shows the search box; get_search_results does the lookup
    search_help_text = "An exact id: this row's, or a task, operation, attempt... it points at."

    def __init__(self, model: type[models.Model], admin_site: admin.AdminSite) -> None:
        super().__init__(model, admin_site)
        concrete = [f for f in model._meta.concrete_fields if not _hidden(f)]
        pk = model._meta.pk
        assert pk is not None
        columns = [pk]
        for f in concrete:
            if f is pk or not isinstance(f, _SHORT) or len(columns) > LIST_COLUMNS:
                continue
            columns.append(f)
        self.list_display = tuple(_shown(f, self, row_page=False) for f in columns)
        self._hidden = tuple(
            f.name for f in (*model._meta.concrete_fields, *model._meta.many_to_many) if _hidden(f)
        )
        # Shown whole on a row's page, every field read-only (non-editable ones included).
        self._shown = tuple(
            _shown(f, self, row_page=True)
            for f in (*model._meta.concrete_fields, *model._meta.many_to_many)
            if not _hidden(f)
        )
        self._ordering = (f"-{pk.name}",)

    def get_exclude(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return self._hidden

    # The stubs type these as field names; Django takes callables too (documented), and the
    # callables are how a value is shown marked (``_shown``).
    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self._shown

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self._shown

    def get_ordering(self, request: HttpRequest) -> tuple[str, ...]:
        return self._ordering

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        # No filter from the query string, on any field: the admin has no list filter, and the
        # search finds a row by its id or one it points at (get_search_results). A lookup allowed
        # here would filter by a field the admin hides (``password__startswith=pbkdf2``, or
        # across a relation, ``user__password__startswith``) and tell its value a character at
        # a time. Refused: DisallowedModelAdminLookup, answered 400 by the console's page.
        return False

    def to_field_allowed(self, request: HttpRequest, to_field: str) -> bool:
        # ``_to_field`` finds a row by another field than its key (the admin's pop-ups for
        # editing relations, which a read-only admin has none of): the key alone.
        pk = self.opts.pk
        return pk is not None and to_field in (pk.name, pk.attname)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.admin_site.has_permission(request)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.admin_site.has_permission(request)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        match = Q(pk__in=[])
        for field in self.model._meta.concrete_fields:
            key = field.attname if field.is_relation else field.name
            target = field.target_field if field.is_relation else field  # type: ignore[attr-defined]
            if (field.primary_key or field.is_relation) and _accepts(target, term):
                match |= Q(**{key: term})
        return queryset.filter(match), False


def _accepts(field: models.Field[Any, Any], term: str) -> bool:
    """Whether ``term`` can be a value of ``field`` (an integer id takes digits only, a text id
    no more than its length): anything else would fail the query instead of finding nothing."""
    try:
        value = field.to_python(term)
    except ValidationError:
        return False
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        return False
    max_length = getattr(field, "max_length", None)
    return max_length is None or len(term) <= max_length


class ConsoleAdminSite(admin.AdminSite):
    site_header = "Agent console: tables (read-only)"
    site_title = "Agent console tables"
    index_title = "Every table, read-only: changes go through the console and the API"
    site_url = "/"

    def has_permission(self, request: HttpRequest) -> bool:
        # Asked for every model on every page (the app list): the roles are read once per request.
        cached = getattr(request, "_admin_allowed", None)
        if cached is None:
            user = request.user
            cached = bool(user.is_authenticated and user.is_active) and policy.allowed(
                can_use_admin, actor_for_user(int(str(user.pk)), user.get_username())
            )
            request._admin_allowed = cached  # type: ignore[attr-defined]
        return bool(cached)

    def admin_view(self, view: Callable[..., Any], cacheable: bool = False) -> Any:
        inner = super().admin_view(view, cacheable)

        def gate(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            # Signed out: the console's own login (one login page, with its limits); signed in
            # without the right: 403, not a login form asking for another account.
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            if not self.has_permission(request):
                return render(request, "console/forbidden.html", status=403)
            return inner(request, *args, **kwargs)  # type: ignore[no-any-return]

        return update_wrapper(gate, inner)

    def get_urls(self) -> list[URLResolver | URLPattern]:
        # No password change here: it would change a password without the audit, on an admin
        # that changes nothing. Its URLs are gone (404); templates/admin/base_site.html drops
        # the link.
        return [
            url
            for url in super().get_urls()
            if getattr(url, "name", None) not in ("password_change", "password_change_done")
        ]

    def login(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        return redirect_to_login(request.GET.get("next") or reverse("admin:index"))


admin_site = ConsoleAdminSite(name="admin")

for _label in APPS:
    for _model in apps.get_app_config(_label).get_models():
        admin_site.register(_model, ReadOnlyAdmin)
admin_site.register(get_user_model(), ReadOnlyAdmin)
admin_site.register(Group, ReadOnlyAdmin)
