"""Error reports that never show a secret.

Django's filter hides settings and request variables whose names look like keys, tokens or
passwords; a database URL (``DATABASE_URL``, in the environment and so in a development
server's request ``META``) carries the password too, under a name it does not hide.
"""

from __future__ import annotations

import re

from django.views.debug import SafeExceptionReporterFilter


class SecretsHiddenFilter(SafeExceptionReporterFilter):
    hidden_settings = re.compile(
        "API|AUTH|TOKEN|KEY|SECRET|PASS|SIGNATURE|HTTP_COOKIE|DATABASE|URL|DSN",
        flags=re.IGNORECASE)
