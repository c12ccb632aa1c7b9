"""The public documents (the OpenAPI schema and its browsable docs): anyone may read them, so
they authenticate nobody. A bad or rate-limited token on the request is ignored rather than
answered 401/429 (a client that sends its token everywhere still reads the schema), and an
error here is the contract's JSON error body whatever format the document was asked in."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.authentication import BaseAuthentication
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response


class _PublicDocument:
    authentication_classes: Sequence[type[BaseAuthentication]] = ()

    def finalize_response(
        self, request: Request, response: Response, *args: Any, **kwargs: Any
    ) -> Response:
        if getattr(response, "exception", False):
            # The documents' own renderers (YAML, an HTML template) cannot render an error
            # body, and a format no renderer takes fails negotiation: errors are JSON.
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = "application/json"
        return super().finalize_response(request, response, *args, **kwargs)  # type: ignore[misc]


class SchemaView(_PublicDocument, SpectacularAPIView):
    pass


class DocsView(_PublicDocument, SpectacularSwaggerSplitView):
    pass
