"""What operators use: the Django admin (``admin``), the JSON API (``api``) and
Prometheus metrics (``metrics``), all acting through ``actions``. See
docs/architecture.md."""
