from django.contrib.auth import views as auth_views
from django.urls import path

import console.converters  # noqa: F401  (registers the <id:...> converter)
from console.web import support, views

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
    path("tasks/<id:task_id>/", views.task_detail, name="task-detail"),
    path("tasks/<id:task_id>/cancel", views.task_cancel, name="task-cancel"),
    path("tasks/<id:task_id>/live", views.task_fragment, name="task-fragment"),
    path("unresolved/", support.unresolved, name="unresolved"),
    path("fragments/unresolved", support.unresolved_fragment, name="unresolved-fragment"),
    path("unresolved/<id:operation_id>/resolve", support.resolve, name="unresolved-resolve"),
]
