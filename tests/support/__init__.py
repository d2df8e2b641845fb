"""Helpers shared by pdx tests."""
