"""Kubernetes' ValidatingAdmissionPolicy, seen from this project: converting one (with each of its
bindings) into AdmissionPolicies that decide the same requests (``convert``), and saying whether
an AdmissionPolicy could be written as one (``portability``).

``rules`` and ``selectors`` hold what both directions share: Kubernetes' resource rules and
label selectors, as this project's ``match`` and as CEL that never errs.
"""
