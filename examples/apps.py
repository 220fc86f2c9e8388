from django.apps import AppConfig


class ExamplesConfig(AppConfig):
    """A business app of the demo: it owns its targets, the engine knows nothing of it."""

    name = "examples"
    verbose_name = "Examples (demo business app)"

    def ready(self) -> None:
        from examples import targets

        targets.register()
