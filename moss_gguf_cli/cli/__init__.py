"""The command-line layer: the only code that imports typer or rich."""
