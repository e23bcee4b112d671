"""Alembic migrations of the online store, shipped inside the package and run at every open."""
