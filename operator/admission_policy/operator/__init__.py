"""Kopf glue: handlers, the policy watcher, status, webhook configurations, certificates, metrics."""
