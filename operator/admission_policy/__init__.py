"""AdmissionPolicy: Kubernetes admission rules in CEL, enforced by a Kopf operator.

Layers, each importing only those before it: ``api`` (parse specs) → ``cel`` (the CEL
environment) → ``engine`` (pure evaluation) → ``operator`` (Kopf glue) and ``cli``.
"""

__version__ = "0.1.0"
