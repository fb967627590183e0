"""The ``fleetbench`` command line: the one package above every layer.

The layers (``exporters``, ``devices``, ``harness``, ``fl``, ``reports``) each register
their own commands (``register(commands)`` in their ``cli`` module); this package
composes them into one parser (`fleetbench.cli`), draws the error boundary around
every command, and holds ``fleetbench demo`` (`fleetbench.demo`), which calls all the
layers in turn. No layer imports this package.
"""
