from django.apps import AppConfig

from console.tracing import tracing_start, tracing_wanted


class ConsoleConfig(AppConfig):
    name = "console"

    def ready(self) -> None:
        # Every process (web, worker, beat) sets its traces up here, once the settings are read
        # and before the web's middleware chain is built (console.tracing): off unless asked.
        if tracing_wanted():
            tracing_start()
