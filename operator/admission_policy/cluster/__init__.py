"""The cluster as the operator and the CLI both see it: API calls with a time limit, discovery,
which requests the webhooks route, listings and resilient watches.

Nothing here knows about Kopf, the webhook server or the policy store, so the CLI's cluster audit
uses it without starting any part of the operator.
"""
