from django.urls import path

import console.converters  # noqa: F401  (registers the <id:...> converter)
from console.api import (
    catalogue,
    control,
    declared_tools,
    humans,
    outcomes,
    schedules,
    views,
    worklist,
)

urlpatterns = [
    path("tasks", views.TaskCollection.as_view(), name="api-tasks"),
    path("tasks/<id:task_id>", views.TaskDetail.as_view(), name="api-task"),
    path("tasks/<id:task_id>/operations", views.TaskOperations.as_view(), name="api-task-ops"),
    path("tasks/<id:task_id>/events", views.TaskEvents.as_view(), name="api-task-events"),
    path("operations", views.OperationCollection.as_view(), name="api-operations"),
    path("operations/<id:operation_id>", views.OperationDetail.as_view(), name="api-operation"),
    path(
        "operations/<id:operation_id>/claim",
        views.OperationClaim.as_view(),
        name="api-operation-claim",
    ),
    path(
        "operations/<id:operation_id>/heartbeat",
        views.OperationHeartbeat.as_view(),
        name="api-operation-heartbeat",
    ),
    path(
        "operations/<id:operation_id>/complete",
        views.OperationComplete.as_view(),
        name="api-operation-complete",
    ),
    path("tasks/<id:task_id>/cancel", control.TaskCancel.as_view(), name="api-task-cancel"),
    path("tasks/<id:task_id>/fail", control.TaskFail.as_view(), name="api-task-fail"),
    path("tasks/<id:task_id>/attempts", control.TaskAttempts.as_view(), name="api-task-attempts"),
    path("tasks/<id:task_id>/budget", control.TaskBudget.as_view(), name="api-task-budget"),
    path(
        "operations/<id:operation_id>/resolve",
        control.OperationResolve.as_view(),
        name="api-operation-resolve",
    ),
    path("tasks/<id:task_id>/complete", outcomes.TaskComplete.as_view(), name="api-task-complete"),
    path("tasks/<id:task_id>/checks", outcomes.TaskChecks.as_view(), name="api-task-checks"),
    path(
        "tasks/<id:task_id>/artifacts", outcomes.TaskArtifacts.as_view(), name="api-task-artifacts"
    ),
    path("artifacts/<id:artifact_id>", outcomes.ArtifactDetail.as_view(), name="api-artifact"),
    path(
        "artifacts/<id:artifact_id>/accept",
        outcomes.ArtifactAccept.as_view(),
        name="api-artifact-accept",
    ),
    path(
        "artifacts/<id:artifact_id>/content",
        outcomes.ArtifactContent.as_view(),
        name="api-artifact-content",
    ),
    path(
        "artifacts/<id:artifact_id>/provenance",
        outcomes.ArtifactProvenance.as_view(),
        name="api-artifact-provenance",
    ),
    path(
        "queues/<str:queue>/items/<id:operation_id>",
        worklist.WorkItemDetail.as_view(),
        name="api-work-item",
    ),
    path(
        "queues/<str:queue>/items/<id:operation_id>/take",
        worklist.WorkItemTake.as_view(),
        name="api-work-item-take",
    ),
    path(
        "queues/<str:queue>/items/<id:operation_id>/give",
        worklist.WorkItemGive.as_view(),
        name="api-work-item-give",
    ),
    path(
        "queues/<str:queue>/items/<id:operation_id>/release",
        worklist.WorkItemRelease.as_view(),
        name="api-work-item-release",
    ),
    path(
        "queues/<str:queue>/items/<id:operation_id>/comments",
        worklist.WorkItemComments.as_view(),
        name="api-work-item-comments",
    ),
    path("approvals", humans.ApprovalCollection.as_view(), name="api-approvals"),
    path(
        "approvals/decisions",
        humans.ApprovalBulkDecisions.as_view(),
        name="api-approval-decisions",
    ),
    path("approvals/<id:approval_id>", humans.ApprovalDetail.as_view(), name="api-approval"),
    path(
        "approvals/<id:approval_id>/decision",
        humans.ApprovalDecision.as_view(),
        name="api-approval-decision",
    ),
    path(
        "approvals/<id:approval_id>/edit", humans.ApprovalEdit.as_view(), name="api-approval-edit"
    ),
    path(
        "approvals/<id:approval_id>/renew",
        humans.ApprovalRenew.as_view(),
        name="api-approval-renew",
    ),
    path("tasks/<id:task_id>/signals", humans.TaskSignals.as_view(), name="api-task-signals"),
    path("tasks/<id:task_id>/pause", humans.TaskPause.as_view(), name="api-task-pause"),
    path("tasks/<id:task_id>/resume", humans.TaskResume.as_view(), name="api-task-resume"),
    path("tasks/<id:task_id>/steer", humans.TaskSteer.as_view(), name="api-task-steer"),
    path("waits", humans.WaitCollection.as_view(), name="api-waits"),
    path("waits/<id:operation_id>/renew", humans.WaitRenew.as_view(), name="api-wait-renew"),
    path(
        "waits/<id:operation_id>/transform",
        humans.WaitTransform.as_view(),
        name="api-wait-transform",
    ),
    path("waits/<id:operation_id>/end", humans.WaitEnd.as_view(), name="api-wait-end"),
    path("tools", catalogue.ToolCatalogue.as_view(), name="api-tools"),
    path(
        "tools/declared",
        declared_tools.DeclaredToolCollection.as_view(),
        name="api-tools-declared",
    ),
    path(
        "tools/declared/<name>",
        declared_tools.DeclaredToolDetail.as_view(),
        name="api-tool-declared",
    ),
    path("schedules", schedules.ScheduleCollection.as_view(), name="api-schedules"),
    path("schedules/<id:schedule_id>", schedules.ScheduleDetail.as_view(), name="api-schedule"),
    path(
        "schedules/<id:schedule_id>/pause",
        schedules.SchedulePause.as_view(),
        name="api-schedule-pause",
    ),
    path(
        "schedules/<id:schedule_id>/resume",
        schedules.ScheduleResume.as_view(),
        name="api-schedule-resume",
    ),
    path(
        "schedules/<id:schedule_id>/trigger",
        schedules.ScheduleTrigger.as_view(),
        name="api-schedule-trigger",
    ),
    path(
        "demo/receivers/<id:receiver>/effects",
        control.ReceiverEffects.as_view(),
        name="api-demo-effects",
    ),
]
