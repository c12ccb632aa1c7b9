from django.contrib.auth import views as auth_views
from django.urls import path

import console.converters  # noqa: F401  (registers the <id:...> converter)
from console.web import (
    auth,
    humans,
    notify_pages,
    operation_page,
    outcomes,
    schedules,
    support,
    tokens,
    views,
)

urlpatterns = [
    path("login/", auth.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.dashboard, name="dashboard"),
    path("fragments/dashboard", views.dashboard_fragment, name="dashboard-fragment"),
    path("tasks/", views.task_list, name="task-list"),
    path("fragments/tasks", views.task_list_fragment, name="task-list-fragment"),
    path("tasks/<id:task_id>/", views.task_detail, name="task-detail"),
    path("tasks/<id:task_id>/cancel", views.task_cancel, name="task-cancel"),
    path("tasks/<id:task_id>/live", views.task_fragment, name="task-fragment"),
    path(
        "operations/<id:operation_id>/",
        operation_page.operation_detail,
        name="operation-detail",
    ),
    path("tools/", operation_page.tool_list, name="tools"),
    path("tokens/", tokens.token_page, name="tokens"),
    path("tokens/<id:token_id>/revoke", tokens.token_revoke, name="token-revoke"),
    path(
        "tasks/<id:task_id>/outcomes",
        outcomes.task_outcomes_fragment,
        name="task-outcomes-fragment",
    ),
    path("unresolved/", support.unresolved, name="unresolved"),
    path("fragments/unresolved", support.unresolved_fragment, name="unresolved-fragment"),
    path("unresolved/<id:operation_id>/resolve", support.resolve, name="unresolved-resolve"),
    path("approvals/", humans.approvals_page, name="approvals"),
    path("fragments/approvals", humans.approvals_fragment, name="approvals-fragment"),
    path("approvals/bulk", humans.approvals_bulk, name="approvals-bulk"),
    path("approvals/<id:approval_id>/decide", humans.approval_decide, name="approval-decide"),
    path("approvals/<id:approval_id>/edit", humans.approval_edit, name="approval-edit"),
    path("waits/", humans.waits_page, name="waits"),
    path("fragments/waits", humans.waits_fragment, name="waits-fragment"),
    path("waits/<id:operation_id>/act", humans.wait_action, name="wait-action"),
    path("tasks/<id:task_id>/control", humans.task_control, name="task-control"),
    path("tasks/<id:task_id>/watch", notify_pages.task_watch, name="task-watch"),
    path("notifications/", notify_pages.notifications_page, name="notifications"),
    path(
        "settings/notifications/",
        notify_pages.notification_settings,
        name="notification-settings",
    ),
    path(
        "settings/notifications/endpoints",
        notify_pages.endpoint_add,
        name="notification-endpoint-add",
    ),
    path(
        "settings/notifications/endpoints/<id:endpoint_id>/remove",
        notify_pages.endpoint_remove,
        name="notification-endpoint-remove",
    ),
    path("schedules/", schedules.schedules_page, name="schedules"),
    path("schedules/<id:schedule_id>/act", schedules.schedule_action, name="schedule-action"),
    path("schedules/<id:schedule_id>/edit", schedules.schedule_edit, name="schedule-edit"),
]
