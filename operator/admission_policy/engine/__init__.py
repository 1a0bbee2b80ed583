"""The policy engine: pure and synchronous, shared by the webhook and the CLI.

Data flows one way: spec → ``compile_policy`` → ``PolicySet`` → ``evaluate`` → ``Decision``
→ ``build_response``.
"""
from .compiler import CompiledPolicy, PolicyCompileError, compile_policy
from .evaluation import Decision, Phase, PolicyOutcome, evaluate
from .policyset import PolicySet
from .request import AdmissionRequest, ReviewError, decode_review, parse_review
from .response import build_response, encode_patch, error_response

__all__ = [
    "AdmissionRequest",
    "CompiledPolicy",
    "Decision",
    "Phase",
    "PolicyCompileError",
    "PolicyOutcome",
    "PolicySet",
    "ReviewError",
    "build_response",
    "compile_policy",
    "decode_review",
    "encode_patch",
    "error_response",
    "evaluate",
    "parse_review",
]
