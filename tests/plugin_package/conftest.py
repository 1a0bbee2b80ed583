"""The plugin package's own test needs the package installed; tests/unit/test_plugins.py installs
it (a dist-info on ``sys.path``) and runs that test there, so the project's run skips collecting it."""
collect_ignore = ["test_label_checksum.py"]
