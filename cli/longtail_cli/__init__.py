"""The ``longtail`` command line: the one entry point users and pod specs call.

It sits above the walls: subcommands import the shared API package directly and import the
operator or worker packages only when their subcommand runs, so the operator image (no torch)
and the worker image (no kopf) can both ship this CLI.
"""
