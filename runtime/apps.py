from importlib import import_module

from django.apps import AppConfig
from django.conf import settings


class RuntimeConfig(AppConfig):
    name = "runtime"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # A team's own tools, in every process that sets Django up (web, workers, beat,
        # management commands): a bad module stops the start here (runtime.tools.loading).
        # Imported by name: the tool modules need the models, which are ready only now.
        loading = import_module("runtime.tools.loading")
        loading.tools_load(settings.TOOL_MODULES)
