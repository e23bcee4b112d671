"""Revisions of the online store schema (one file each; alembic reads them from here)."""
