"""Backends: one file per backend library, each exporting its Backend record."""
