"""The command-line layer: the only code that imports typer or rich. One module per command
(parse the options, call one core function, render its result), _command.py (the decorator
every command is declared with), app.py (registers them), _errors.py (the one catch point),
_output.py (console, progress bars), _options.py (shared options).

May import: every room (rank 9: families/, serve/, pipeline/, verify/, doctor/, nano/, tts/,
quantize/, source/, gguf/, disk/, native/, the top level); nothing imports cli/ but
``__main__``. Which family a command's input is, the registry (families/) says.
"""
