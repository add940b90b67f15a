"""Helpers that more than one of cdi's programs needs (kept deliberately small)."""
