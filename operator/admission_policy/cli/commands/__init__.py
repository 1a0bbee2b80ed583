"""One module per command of ``admission-policy``; ``cli/__init__.py`` puts them in its group.

Here only the click wiring of each command: flags, exit codes, what it prints. What a command
does lives in the CLI's library modules beside this package (``cli/audit.py``, ``cli/lint.py`` …).
"""
