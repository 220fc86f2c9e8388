"""The worker side: a worker process (``worker``) runs the fast lane (``fast``), the long
lane (``long``) and companion services under partition leases (``partitions``); every handler
result goes through the one outcome path (``outcomes``). See docs/architecture.md."""
