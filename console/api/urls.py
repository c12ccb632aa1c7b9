from django.urls import path

from console.api import views

urlpatterns = [
    path("tasks", views.TaskCollection.as_view(), name="api-tasks"),
    path("tasks/<str:task_id>", views.TaskDetail.as_view(), name="api-task"),
    path("tasks/<str:task_id>/operations", views.TaskOperations.as_view(), name="api-task-ops"),
    path("tasks/<str:task_id>/events", views.TaskEvents.as_view(), name="api-task-events"),
    path("operations", views.OperationCollection.as_view(), name="api-operations"),
    path("operations/<str:operation_id>", views.OperationDetail.as_view(), name="api-operation"),
    path(
        "operations/<str:operation_id>/claim",
        views.OperationClaim.as_view(),
        name="api-operation-claim",
    ),
    path(
        "operations/<str:operation_id>/heartbeat",
        views.OperationHeartbeat.as_view(),
        name="api-operation-heartbeat",
    ),
    path(
        "operations/<str:operation_id>/complete",
        views.OperationComplete.as_view(),
        name="api-operation-complete",
    ),
]
