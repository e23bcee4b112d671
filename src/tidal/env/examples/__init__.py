"""Example environments (documented in docs/environments.md, exercised by tests)."""
