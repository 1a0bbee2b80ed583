"""The plugins shipped in the package: ``image-references`` and ``tls-secrets``."""
