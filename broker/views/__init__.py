"""Read models for the admin views (API, CLI and dashboard): plain functions over the store and
the configuration that return pydantic models. No HTTP here."""
