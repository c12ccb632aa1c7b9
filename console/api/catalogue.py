"""The tool catalogue (GET /api/v1/tools): what each tool is, promises and accepts, so agents
and people learn a tool's parameters without reading its source."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from console.api import schema as doc
from console.api.auth import actor_of
from console.api.views import ApiView
from runtime import policy
from runtime.tools.base import declared_refresh, tool_catalogue


class ToolCatalogue(ApiView):
    @extend_schema(
        operation_id="v1_tools_list",
        responses=doc.responses({200: doc.ToolListSerializer}),
    )
    def get(self, request: Request) -> Response:
        policy.can_read_tool_catalogue(actor_of(request))
        declared_refresh()  # what admins declared since this process last read the declarations
        return Response({"results": tool_catalogue()})
