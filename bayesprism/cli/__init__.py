"""Command-line interface: one thin module per sub-command (``bayesprism.cli.<name>``)."""
