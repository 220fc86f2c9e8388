"""Settings of the test suite: the demo project's with DEBUG off, as in production, with a
secret key of its own (the demo refuses to start with DEBUG off and no key) and no redirect
to HTTPS (the test client and the browser tests speak plain HTTP)."""

import os

os.environ.setdefault("DJANGO_SECRET_KEY", "tests-only-secret-key-" + "x" * 40)
os.environ.setdefault("DJANGO_SECURE_SSL_REDIRECT", "0")

from config.settings import *  # noqa: F403
