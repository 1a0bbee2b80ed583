"""The one base of the errors this package raises on purpose.

Each error class lives beside the code that raises it; all derive from :class:`AdmissionPolicyError`
so that a boundary can catch this one class and still tell a refusal (a message for the user) from
a defect (any other exception, worth its traceback):

- the CLI prints it as a message and exits non-zero;
- the webhook answers a ReviewError with 400, and an evaluation error with the policy's
  ``failurePolicy`` (the server never crashes on either);
- the operator writes a policy's errors into its status conditions.

A class that callers also catch as ``ValueError`` (parsing, reading input) keeps that base too:
``class PolicyError(AdmissionPolicyError, ValueError)``.

The families, by where they are raised:

- a policy that cannot be used (refused at ``kubectl apply``, shown in its status, listed by
  ``lint``): ``api.PolicyError`` (raised by ``fields``' readers too), ``engine.compiler.PolicyCompileError`` (one
  ``cel.CelCompileError`` per expression), ``plugins.ConfigError``;
- a ValidatingAdmissionPolicy that cannot be converted: ``vap.objects.VapObjectError``;
- a request that cannot be evaluated: ``engine.request.ReviewError``;
- one policy failing on one request (its ``failurePolicy`` decides): ``cel.CelEvaluationError``,
  ``engine.patching.PatchError``, ``engine.inputs.InputsError``,
  ``engine.plugincalls.PluginCallError`` (wrapping ``engine.plugincalls.PluginFault``, which
  names what the plugin raised: ``plugins.StaleData`` …);
- Go's and Kubernetes' own errors, which CEL functions surface as evaluation errors
  (``cel.lib``: QuantityError, FormatError, RegexError, NetipError, UrlError);
- authorizer checks without an answer where none can be asked (a scan, the CLI):
  ``authorization.Unanswered``;
- settings, the cluster and input files: ``features.FeatureGateError``,
  ``operator.certificates.CertificateError``, ``cluster.listing.ListingError``,
  ``cli.documents.DocumentError``;
- ``cel.syntax.AstError``: a compiled CEL program in a form this package cannot read (the CEL
  library's upgrade, not the user's mistake).
"""
from __future__ import annotations


class AdmissionPolicyError(Exception):
    """What this package raises on purpose; its message is meant for the user as it is."""
