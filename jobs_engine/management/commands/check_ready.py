from typing import Any

from django.core.management.base import BaseCommand, CommandError

from jobs_engine.errors import DatabaseNotReady
from jobs_engine.readiness import check_database


class Command(BaseCommand):
    help = ("Exit 0 when the database answers and is migrated; otherwise print one line "
            "naming the problem and exit 1. A container runs it before its web server.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--database", default="default",
                            help="The database alias to check (default: default).")
        parser.add_argument("--unmigrated-ok", action="store_true",
                            help="Only check that the database answers (before migrate).")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            check_database(options["database"], migrated=not options["unmigrated_ok"])
        except DatabaseNotReady as exc:
            raise CommandError(str(exc)) from None
        if options["verbosity"] > 1:
            self.stdout.write("the database answers and is migrated")
