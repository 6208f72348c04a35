"""Checks a maintainer reruns by hand against a finished run (not part of `make test`)."""
