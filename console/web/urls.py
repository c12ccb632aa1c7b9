from django.contrib.auth import views as auth_views
from django.urls import path

from console.web import humans, support, views

urlpatterns = [
    path(
        "login/",
        auth_views.LoginView.as_view(template_name="console/login.html"),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.dashboard, name="dashboard"),
    path("fragments/dashboard", views.dashboard_fragment, name="dashboard-fragment"),
    path("tasks/", views.task_list, name="task-list"),
    path("fragments/tasks", views.task_list_fragment, name="task-list-fragment"),
    path("tasks/<str:task_id>/", views.task_detail, name="task-detail"),
    path("tasks/<str:task_id>/cancel", views.task_cancel, name="task-cancel"),
    path("tasks/<str:task_id>/live", views.task_fragment, name="task-fragment"),
    path("unresolved/", support.unresolved, name="unresolved"),
    path("fragments/unresolved", support.unresolved_fragment, name="unresolved-fragment"),
    path("unresolved/<str:operation_id>/resolve", support.resolve, name="unresolved-resolve"),
    path("approvals/", humans.approvals_page, name="approvals"),
    path("fragments/approvals", humans.approvals_fragment, name="approvals-fragment"),
    path("approvals/bulk", humans.approvals_bulk, name="approvals-bulk"),
    path("approvals/<str:approval_id>/decide", humans.approval_decide, name="approval-decide"),
    path("approvals/<str:approval_id>/edit", humans.approval_edit, name="approval-edit"),
    path("waits/", humans.waits_page, name="waits"),
    path("fragments/waits", humans.waits_fragment, name="waits-fragment"),
    path("waits/<str:operation_id>/act", humans.wait_action, name="wait-action"),
    path("tasks/<str:task_id>/control", humans.task_control, name="task-control"),
]
