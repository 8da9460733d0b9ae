"""Shared pattern factories and pattern rules that backends build on."""
