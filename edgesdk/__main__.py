"""``python -m edgesdk`` runs the CLI."""

from edgesdk.cli import entry

entry()
