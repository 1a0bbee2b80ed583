"""The policy engine: pure and synchronous, shared by the webhook and the CLI.

Data flows one way: spec → ``compile_policy`` → ``PolicySet`` → ``evaluate`` → ``Decision``
→ ``build_response``. Params and context come in as plain data (``Inputs``), like the namespace;
AdmissionPolicyExceptions as an ``ExceptionSet``, built once like the ``PolicySet``.
"""
from .compiler import CompiledPolicy, PolicyCompileError, compile_policy, load_policy
from .evaluation import Phase, evaluate
from .exceptions import CompiledException, ExceptionCompileError, ExceptionSet, Exemption, compile_exception
from .inputs import Inputs, Listing, NoInputs, StaticInputs
from .policyset import PolicySet
from .request import AdmissionRequest, ReviewError, decode_review, parse_review
from .response import build_response, encode_patch, error_response
from .verdicts import Decision, Finding, PolicyOutcome

__all__ = [
    "AdmissionRequest",
    "CompiledException",
    "CompiledPolicy",
    "Decision",
    "ExceptionCompileError",
    "ExceptionSet",
    "Exemption",
    "Finding",
    "Inputs",
    "Listing",
    "NoInputs",
    "Phase",
    "PolicyCompileError",
    "PolicyOutcome",
    "PolicySet",
    "ReviewError",
    "StaticInputs",
    "build_response",
    "compile_exception",
    "compile_policy",
    "decode_review",
    "encode_patch",
    "error_response",
    "evaluate",
    "load_policy",
    "parse_review",
]
