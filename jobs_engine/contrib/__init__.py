"""Optional apps, inside the engine's package so they take no top-level name from a host."""
