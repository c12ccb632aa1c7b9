from django.urls import include, path

from console.admin import admin_site
from console.api.public import DocsView, SchemaView
from console.health import healthz
from console.metrics import metrics

# The API first: agents' requests are most of the traffic, and each pattern tried before the
# match costs every request a little.
urlpatterns = [
    path("api/v1/", include("console.api.urls")),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),
    path("admin/", admin_site.urls),
    path("api/schema/", SchemaView.as_view(), name="schema"),
    path("api/docs/", DocsView.as_view(url_name="schema"), name="docs"),
    path("", include("console.web.urls")),
]

handler400 = "console.web.views.bad_request"
handler403 = "console.web.views.forbidden"
handler404 = "console.web.views.not_found"
handler500 = "console.web.views.server_error"
