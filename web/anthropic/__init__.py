"""Anthropic's Messages API on the queue (`POST /v1/messages`, `POST /v1/messages/count_tokens`), for the clients
that speak it: the `anthropic` SDKs and coding agents (Claude Code). Its requests: schemas.py; its answers, whole and
streamed: body.py; its routes: messages.py. Errors on these routes take Anthropic's shape (web/errors.py)."""
